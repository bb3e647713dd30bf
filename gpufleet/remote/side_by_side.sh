#!/bin/bash
# Commands side by side, read back in the order they were started (sent ahead of facts.sh and read_batch.sh, which
# use it): gf_start runs its command in a subshell of this shell, and its output, then `@@gpufleet-rc=N` (its exit
# code), go into a pipe of its own (a process substitution); gf_collect I reads the I-th once it has ended. Pipes,
# not files: no temporary directory to make and remove (two processes, 2.5 ms of the host's CPU every time), nothing
# written. A command with more output than a pipe holds waits for its turn to be read. `gf_limit SECONDS` bounds the
# whole set: a command still running then is stopped, with every process under it, and reads as exit code 124 (one
# deadline for the script, in place of a `timeout` process around each command: 2.3 ms of a host's CPU apiece).
gf_fds=()
gf_pids=()
gf_deadline=
gf_limit_s=
GF_READ_ALL=1073741824

# $1: seconds from now (bash's $SECONDS, whole seconds) after which gf_collect stops waiting
gf_limit() {
    gf_limit_s=$1
    gf_deadline=$((SECONDS + $1))
}

# the command and its arguments; stdin from /dev/null: the script itself may be arriving on stdin (bash -s)
gf_start() {
    local fd
    # the subshell's own stderr too: nothing it leaves running holds the SSH session's stderr open
    exec {fd}< <(exec 2>&1 </dev/null; "$@"; printf '\n@@gpufleet-rc=%d' "$?")
    gf_fds+=("$fd")
    gf_pids+=("$!")
}

# $1: a started command's subshell. SIGKILL to it and every process under it (found through /proc by bash alone:
# only a stopped command comes here); all of them only read.
gf_stop() {
    local -A kids=()
    local stat line rest pid ppid todo=("$1") doomed=()
    if [ -z "$1" ]; then return 0; fi  # bash before 4.4 gives no pid for a process substitution
    for stat in /proc/[0-9]*/stat; do
        { IFS= read -r line <"$stat"; } 2>/dev/null || continue
        rest=${line##*) }  # after the command name, which may hold spaces and parentheses: state, then ppid
        rest=${rest#* }
        ppid=${rest%% *}
        kids[$ppid]+=" ${line%% *}"
    done
    while [ ${#todo[@]} -gt 0 ]; do
        pid=${todo[0]}
        todo=("${todo[@]:1}")
        doomed+=("$pid")
        todo+=(${kids[$pid]:-})
    done
    kill -KILL "${doomed[@]}" 2>/dev/null
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
    local left status=0
    if [ -z "$gf_deadline" ]; then
        IFS= read -r -N "$GF_READ_ALL" gf_out <&"${gf_fds[$1]}"
    else
        left=$((gf_deadline - SECONDS))
        if [ "$left" -lt 1 ]; then left=0.05; fi  # past the deadline: one short look (-t 0 reads nothing)
        IFS= read -r -t "$left" -N "$GF_READ_ALL" gf_out <&"${gf_fds[$1]}" || status=$?
    fi
    if [ "$status" -gt 128 ]; then  # still running at the deadline: what it printed so far, then why it ends there
        gf_stop "${gf_pids[$1]}"
        exec {gf_fds[$1]}<&-
        while [[ $gf_out == *$'\n' ]]; do gf_out=${gf_out%?}; done
        gf_out+=${gf_out:+$'\n'}"gpufleet: still running after ${gf_limit_s}s: stopped"
        gf_rc=124
        return 0
    fi
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
