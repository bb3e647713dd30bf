#!/bin/bash
# job_start DIR LOG RC_FILE PID_FILE UNIT COMMAND RETRY_FAILED [PROPERTY...]: start COMMAND (shell text) detached
# from the SSH connection, as a transient systemd unit (a new session where there is no systemd), unless it runs or
# has finished; a failed job is started again only when RETRY_FAILED is 1. Prints and leaves in $st what it found:
# `started`, `running` or `finished RC`. Never exits: text after it (job_wait.sh) runs either way.
# The job writes its output to LOG and, last, its exit code to RC_FILE (atomically).
# A library after job_state.sh: the caller appends the call (gpufleet/engine/detached.py).
job_start() {
    local dir=$1 log=$2 rc=$3 pid=$4 unit=$5 command=$6 retry=$7
    shift 7
    # The wrapper records its own pid ($! may be setsid's, which forks and exits when it leads a process group).
    # A job killed by a shutdown has no exit code of its own: the wrapper writes none, as if it had died with it.
    local wrapper='[ -z "$4" ] || echo $$ > "$4"; eval "$1" >> "$2" 2>&1; rc=$?
        if [ $rc -gt 128 ] && [ "$(systemctl is-system-running 2>/dev/null)" = stopping ]; then exit $rc; fi
        echo $rc > "$3.tmp" && mv "$3.tmp" "$3"'
    mkdir -p -- "$dir" || return
    st=$(job_state "$rc" "$unit" "$pid")
    case "$st" in
        running|"finished 0") echo "$st"; return;;
        finished*) if [ "$retry" != 1 ]; then echo "$st"; return; fi;;
    esac
    rm -f -- "$log" "$rc" "$pid"
    : > "$log"
    if command -v systemd-run >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl reset-failed -- "$unit" >/dev/null 2>&1 || true
        local props=(--property=TimeoutStopSec=30)
        local p
        for p in "$@"; do props+=("--property=$p"); done
        systemd-run --quiet --unit="$unit" --collect "${props[@]}" \
            --setenv=HOME="${HOME:-/root}" --setenv=PATH="$PATH" \
            /bin/bash -c "$wrapper" job "$command" "$log" "$rc" "" || { local e=$?; outlive_shutdown; return $e; }
    else
        # No systemd (a GPU box in a container): a new session keeps it alive when SSH drops.
        setsid nohup /bin/bash -c "$wrapper" job "$command" "$log" "$rc" "$pid" < /dev/null > /dev/null 2>&1 &
        local waited=0
        while [ ! -s "$pid" ] && [ ! -s "$rc" ] && [ "$waited" -lt 100 ]; do sleep 0.05; waited=$((waited + 1)); done
    fi
    st=started
    echo started
}
