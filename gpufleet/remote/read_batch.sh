#!/bin/bash
# Run read-only commands side by side and print, in the order given, a marker line `@@gpufleet-read INDEX rc=N@@`
# then each one's output (stdout and stderr; trailing newlines are not kept). Arguments: after a label (the
# script's $0), each command's shell text, run by bash with stdin from /dev/null.
# Only bash builtins after mktemp: each read's exit code from `wait`, its output read into a variable (a `cat` per
# read cost more of the host's CPU than most reads themselves).
# reads never take git's optional locks: side by side, one read's index refresh must not fail another's git
export GIT_OPTIONAL_LOCKS=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-reads.XXXXXX") || exit 1
trap 'rm -rf -- "$dir"' EXIT
pids=()
i=0
for text in "$@"; do
    bash -c "$text" >"$dir/$i.out" 2>&1 </dev/null &
    pids[i]=$!
    i=$((i + 1))
done
i=0
for text in "$@"; do
    wait "${pids[i]}"
    rc=$?
    out=
    IFS= read -r -d '' out <"$dir/$i.out"
    while [ "${out%$'\n'}" != "$out" ]; do out=${out%$'\n'}; done
    printf '@@gpufleet-read %d rc=%s@@\n' "$i" "$rc"
    if [ -n "$out" ]; then printf '%s\n' "$out"; fi
    i=$((i + 1))
done
