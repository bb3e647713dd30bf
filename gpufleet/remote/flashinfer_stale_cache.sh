#!/bin/bash
# Exit 0 (a clear is needed) when the flashinfer JIT cache holds an entry older than the installed
# flashinfer-python: kernels compiled by another flashinfer version must not be reused. This also holds after a
# run that installed flashinfer but failed before clearing, so a re-run still clears.
# Args: $1 the venv.
d="$HOME/.cache/flashinfer"
[ -d "$d" ] || exit 1
stamp=$(ls -d "$1"/lib/python*/site-packages/flashinfer_python-*.dist-info 2>/dev/null | head -n 1)
[ -n "$stamp" ] || exit 0
[ -n "$(find "$d" -mindepth 1 ! -newer "$stamp" -print -quit)" ]
