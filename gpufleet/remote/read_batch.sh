#!/bin/bash
# Run read-only commands side by side and print, in the order given, a marker line `@@gpufleet-read INDEX rc=N@@`
# then each one's output (stdout and stderr; trailing newlines are not kept). Arguments: after a label (the
# script's $0), each command's shell text, run with stdin from /dev/null.
# Each read runs in a subshell of this one (eval), not a new bash: a read is usually `bash -c SCRIPT ...` itself,
# and a second bash started per read cost the host a few ms of CPU each. Its output comes back through a pipe of its
# own (a process substitution), then `@@gpufleet-rc=N`; no temporary files. Only bash builtins besides the reads.
# reads never take git's optional locks: side by side, one read's index refresh must not fail another's git
export GIT_OPTIONAL_LOCKS=0
gf_fds=()
for gf_text in "$@"; do
    # ( ... ): a read's own `exit N` ends only its subshell, and N is its exit code; no positional parameters
    exec {gf_fd}< <(set --; (eval "$gf_text") 2>&1 </dev/null; printf '\n@@gpufleet-rc=%d' "$?")
    gf_fds+=("$gf_fd")
done
for gf_i in "${!gf_fds[@]}"; do
    gf_out=
    IFS= read -r -d '' gf_out <&"${gf_fds[gf_i]}"
    exec {gf_fds[gf_i]}<&-
    gf_rc=${gf_out##*$'\n'@@gpufleet-rc=}
    case "$gf_out" in
        *$'\n'@@gpufleet-rc=*) gf_out=${gf_out%$'\n'@@gpufleet-rc=*} ;;
        *) gf_rc=255 ;;  # killed before it could say its exit code
    esac
    case "$gf_rc" in ''|*[!0-9]*) gf_rc=255 ;; esac
    while [ "${gf_out%$'\n'}" != "$gf_out" ]; do gf_out=${gf_out%$'\n'}; done
    printf '@@gpufleet-read %d rc=%s@@\n' "$gf_i" "$gf_rc"
    if [ -n "$gf_out" ]; then printf '%s\n' "$gf_out"; fi
done
