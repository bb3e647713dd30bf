#!/bin/bash
# Commands side by side, read back in the order they were started (sent ahead of facts.sh and read_batch.sh, which
# use it): gf_start runs its command in a subshell of this shell, and its output, then `@@gpufleet-rc=N` (its exit
# code), go into a pipe of its own (a process substitution); gf_collect I reads the I-th once it has ended. Pipes,
# not files: no temporary directory to make and remove (two processes, 2.5 ms of the host's CPU every time), nothing
# written. A command with more output than a pipe holds waits for its turn to be read.
gf_fds=()

# the command and its arguments; stdin from /dev/null: the script itself may be arriving on stdin (bash -s)
gf_start() {
    local fd
    exec {fd}< <("$@" 2>&1 </dev/null; printf '\n@@gpufleet-rc=%d' "$?")
    gf_fds+=("$fd")
}

# $1: the index of a started command. Its output into gf_out (trailing newlines dropped, as $(...) drops them), its
# exit code into gf_rc (255: it was killed before it could say).
gf_collect() {
    gf_out=
    IFS= read -r -d '' gf_out <&"${gf_fds[$1]}"
    exec {gf_fds[$1]}<&-
    gf_rc=${gf_out##*$'\n'@@gpufleet-rc=}
    case "$gf_out" in
        *$'\n'@@gpufleet-rc=*) gf_out=${gf_out%$'\n'@@gpufleet-rc=*} ;;
        *) gf_rc=255 ;;
    esac
    case "$gf_rc" in ''|*[!0-9]*) gf_rc=255 ;; esac
    while [ "${gf_out%$'\n'}" != "$gf_out" ]; do gf_out=${gf_out%$'\n'}; done
}
