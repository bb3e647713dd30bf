#!/bin/bash
# job_wait LOG RC_FILE UNIT PID_FILE POLL: after job_start, stream the job's log (a new job's from its start, a
# picked-up one's from its last 20 lines) until its exit-code file appears, then exit with that code; exit 1 when
# the job vanished without one. Uses $st from job_start.
# A library after job_state.sh and job_start.sh: the caller appends the call (gpufleet/engine/detached.py).
job_wait() {
    local log=$1 rc=$2 unit=$3 pid=$4 poll=$5 from=20 tp
    if [ "$st" = started ]; then from=+1; fi
    tail -n "$from" -F -- "$log" 2>/dev/null &
    tp=$!
    while [ ! -s "$rc" ]; do
        if [ "$(job_state "$rc" "$unit" "$pid")" = absent ]; then
            kill $tp
            echo "gpufleet: $unit died without an exit code"
            exit 1
        fi
        sleep "$poll"
    done
    sleep 1
    kill $tp 2>/dev/null
    exit "$(cat -- "$rc")"
}
