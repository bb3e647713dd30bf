#!/bin/bash
# job_state RC_FILE UNIT PID_FILE: a detached job's state, `finished RC`, `running` or `absent`.
# The exit-code file is written last by the job's wrapper, so its presence means the log is complete.
# outlive_shutdown: while the host shuts down, wait (up to 10 minutes) for the shutdown to end this connection.
# A library: the caller appends the call (gpufleet/engine/detached.py).
job_state() {
    if [ -s "$1" ]; then echo "finished $(cat -- "$1")"
    elif systemctl is-active --quiet -- "$2" 2>/dev/null; then echo running
    elif [ -s "$3" ] && kill -0 "$(cat -- "$3")" 2>/dev/null; then echo running
    # the job may have written its exit code and ended between the first look and the two after it
    elif [ -s "$1" ]; then echo "finished $(cat -- "$1")"
    else echo absent
    fi
}

outlive_shutdown() {
    # Once a shutdown is queued, systemd refuses new units ("transaction is destructive") and stops the running
    # ones before it ends the SSH sessions. Either would read as the job's own failure (exit 1); waiting here lets
    # the caller see the connection drop instead, reattach after the boot and learn the job never finished.
    [ "$(systemctl is-system-running 2>/dev/null)" = stopping ] || return 0
    echo "gpufleet: the host is shutting down: waiting for it to drop this connection"
    local n=0
    while [ "$(systemctl is-system-running 2>/dev/null)" = stopping ] && [ "$n" -lt 3000 ]; do
        sleep 0.2; n=$((n + 1))
    done
}
