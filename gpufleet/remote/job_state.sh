#!/bin/bash
# job_state RC_FILE UNIT PID_FILE: a detached job's state, `finished RC`, `running` or `absent`.
# The exit-code file is written last by the job's wrapper, so its presence means the log is complete.
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
