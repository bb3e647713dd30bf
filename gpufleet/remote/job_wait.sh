#!/bin/bash
# job_wait LOG RC_FILE UNIT PID_FILE POLL: after job_start, stream the job's log (a new job's from its start, a
# picked-up one's from its last 20 lines) until its exit-code file appears, then exit with that code; exit 1 when
# the job vanished without one. Uses $st from job_start.
# The log is read by byte offset each POLL seconds, not by a background `tail -F`: the exit-code file is written
# after the last output, so one more read once it exists prints everything, however loaded the host is.
# A library after job_state.sh and job_start.sh: the caller appends the call (gpufleet/engine/detached.py).
job_wait() {
    local log=$1 rc=$2 unit=$3 pid=$4 poll=$5 off=0 size
    if [ "$st" != started ]; then
        size=$(stat -c %s -- "$log" 2>/dev/null || echo 0)
        off=$((size - $(tail -n 20 -- "$log" 2>/dev/null | wc -c)))
    fi
    while :; do
        local done=
        [ -s "$rc" ] && done=1
        size=$(stat -c %s -- "$log" 2>/dev/null || echo 0)
        if [ "$size" -gt "$off" ]; then
            tail -c +$((off + 1)) -- "$log" | head -c $((size - off))
            off=$size
        fi
        if [ -n "$done" ]; then exit "$(cat -- "$rc")"; fi
        if [ "$(job_state "$rc" "$unit" "$pid")" = absent ]; then
            outlive_shutdown
            echo "gpufleet: $unit died without an exit code"
            exit 1
        fi
        sleep "$poll"
    done
}
