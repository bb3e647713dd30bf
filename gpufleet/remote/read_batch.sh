#!/bin/bash
# Run read-only commands side by side and print, in the order given, a marker line `@@gpufleet-read INDEX rc=N@@`
# then each one's output (stdout and stderr; trailing newlines are not kept). Arguments: after a label (the
# script's $0), each command's shell text, run by bash with stdin from /dev/null.
# reads never take git's optional locks: side by side, one read's index refresh must not fail another's git
export GIT_OPTIONAL_LOCKS=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-reads.XXXXXX") || exit 1
trap 'rm -rf -- "$dir"' EXIT
i=0
for text in "$@"; do
    ( bash -c "$text" >"$dir/$i.out" 2>&1 </dev/null; echo $? >"$dir/$i.rc" ) &
    i=$((i + 1))
done
wait
i=0
for text in "$@"; do
    rc=$(cat "$dir/$i.rc" 2>/dev/null) || rc=255
    out=$(cat "$dir/$i.out" 2>/dev/null)
    printf '@@gpufleet-read %d rc=%s@@\n' "$i" "$rc"
    if [ -n "$out" ]; then printf '%s\n' "$out"; fi
    i=$((i + 1))
done
