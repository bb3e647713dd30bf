#!/bin/bash
# The checkout's sgl-kernel at HEAD and the build records: `@@dir D` and `@@tree SHA` of the first candidate
# directory whose pyproject names sgl-kernel (with `@@pyproject` and `@@cmake` texts when asked for), then
# `@@installed` (the venv's build record), `@@record` (a build's record on the host) and `@@end`.
# Args: $1 checkout, $2 "1" for the pyproject and CMakeLists texts, $3 installed record, $4 build record,
# $5... candidate directories, newest layout last.
co=$1 full=$2 installed=$3 record=$4
shift 4
export GIT_OPTIONAL_LOCKS=0  # a read never rewrites the checkout's index (it may belong to another user)
g() { git -c safe.directory='*' -C "$co" "$@"; }
# $1: a file; its whole text, as cat prints it (bash's own read: no process)
gf_cat() { local text=; IFS= read -r -d '' text <"$1"; printf '%s' "$text"; }
name_re='^name *= *"([^"]*)"'
for d in "$@"; do
    # the pyproject at HEAD, read once (its name line found by bash, not sed | head); kept byte for byte
    pyproject=
    # -N: read in blocks to the end (`-d ''` reads a pipe one byte per system call)
    IFS= read -r -N 1073741824 pyproject < <(g show "HEAD:$d/pyproject.toml" 2>/dev/null)
    name=
    while IFS= read -r line; do
        if [[ $line =~ $name_re ]]; then name=${BASH_REMATCH[1]}; break; fi
    done <<<"$pyproject"
    case "$name" in sgl-kernel|sgl_kernel|sglang-kernel|sglang_kernel) ;; *) continue ;; esac
    echo "@@dir $d"
    echo "@@tree $(g rev-parse "HEAD:$d" 2>/dev/null)"
    if [ -n "$full" ]; then
        echo "@@pyproject"; printf '%s' "$pyproject"; echo
        echo "@@cmake"; g show "HEAD:$d/CMakeLists.txt" 2>/dev/null; echo
    fi
    break
done
echo "@@installed"; gf_cat "$installed" 2>/dev/null; echo; echo "@@record"; gf_cat "$record" 2>/dev/null; echo
echo "@@end"
