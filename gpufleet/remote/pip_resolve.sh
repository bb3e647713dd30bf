#!/bin/bash
# Resolve on the host without installing: pip's own lines (warnings) go to stderr, then
# `@@gpufleet-pip-report@@` and pip's JSON report on stdout.
# Args: $1 constraints text, $2... the pip command (`install --dry-run ...`).
cons=$(mktemp) && rep=$(mktemp) || exit 1
trap 'rm -f "$cons" "$rep"' EXIT
printf '%s\n' "$1" > "$cons"; shift
"$@" -c "$cons" --report "$rep" 1>&2 || exit $?
echo @@gpufleet-pip-report@@
cat "$rep"
