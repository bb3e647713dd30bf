#!/bin/bash
# Commands side by side, read back in the order they were started (sent ahead of facts.sh and read_batch.sh, which
# use it): gf_start runs its command in a subshell of this shell, and its output, then `@@gpufleet-rc=N` (its exit
# code), go into a pipe of its own (a process substitution); gf_collect I reads the I-th once it has ended. Pipes,
# not files: no temporary directory to make and remove (two processes, 2.5 ms of the host's CPU every time), nothing
# written. A command with more output than a pipe holds waits for its turn to be read.
gf_fds=()
GF_READ_ALL=1073741824

# the command and its arguments; stdin from /dev/null: the script itself may be arriving on stdin (bash -s)
gf_start() {
    local fd
    exec {fd}< <("$@" 2>&1 </dev/null; printf '\n@@gpufleet-rc=%d' "$?")
    gf_fds+=("$fd")
}

# $1: the index of a started command. Its output into gf_out (trailing newlines dropped, as $(...) drops them), its
# exit code into gf_rc (255: it was killed before it could say).
gf_collect() {
    # bytes, not characters: bash's pattern and length operations on output are several times dearer in a UTF-8
    # locale; nothing here starts a process, so no command sees this locale
    local LC_ALL=C head
    gf_out=
    # -N (a count no output reaches) reads to the end in blocks: `read -d ''` reads a pipe one byte per system call
    # (30 KB of output cost the host ~4 ms of CPU); bash >= 5.1 buffers -N, older ones read it bytewise as before
    IFS= read -r -N "$GF_READ_ALL" gf_out <&"${gf_fds[$1]}"
    exec {gf_fds[$1]}<&-
    # the exit code after the last marker: the shortest suffix from the marker on is found from the end
    head=${gf_out%$'\n'@@gpufleet-rc=*}
    if [ ${#head} -eq ${#gf_out} ]; then
        gf_rc=255
    else
        gf_rc=${gf_out:${#head}+15}
        gf_out=$head
    fi
    case "$gf_rc" in ''|*[!0-9]*) gf_rc=255 ;; esac
    # one look at the last byte (`[ "${gf_out%$'\n'}" != "$gf_out" ]` tried every suffix: ~3 ms a 30 KB output)
    while [[ $gf_out == *$'\n' ]]; do gf_out=${gf_out%?}; done
}
