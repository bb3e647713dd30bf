#!/bin/bash
# Run read-only commands side by side and print, in the order given, a marker line `@@gpufleet-read INDEX rc=N@@`
# then each one's output (stdout and stderr; trailing newlines are not kept). Sent after side_by_side.sh. Arguments:
# after a label (the script's $0), each command's shell text, run with stdin from /dev/null.
# Each read runs in a subshell of this shell (eval), not in a new bash: a read is usually `bash -c SCRIPT ...`
# itself, and a second bash started for each read cost the host a few ms of CPU. Only bash builtins besides the reads.
# reads never take git's optional locks: side by side, one read's index refresh must not fail another's git
export GIT_OPTIONAL_LOCKS=0

# $1: a read's text. In a subshell of its own: its `exit N` ends only that subshell, and N is its exit code; it sees
# no positional parameters.
gf_read() {
    local gf_text=$1
    set --
    (eval "$gf_text")
}

for gf_text in "$@"; do gf_start gf_read "$gf_text"; done
for gf_i in "${!gf_fds[@]}"; do
    gf_collect "$gf_i"
    printf '@@gpufleet-read %d rc=%s@@\n' "$gf_i" "$gf_rc"
    if [ -n "$gf_out" ]; then printf '%s\n' "$gf_out"; fi
done
