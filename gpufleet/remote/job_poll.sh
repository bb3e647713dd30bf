#!/bin/bash
# One poll of a detached job (after job_state.sh): `@@rc RC` (empty while it runs), `@@st STATE`, `@@size BYTES`
# of its log, then the log's bytes from OFFSET on.
# Args: $1 exit-code file, $2 unit, $3 pid file, $4 log, $5 offset (bytes of the log already read).
rc=$(cat -- "$1" 2>/dev/null || true)
st=$(job_state "$1" "$2" "$3")
s=$(stat -c %s -- "$4" 2>/dev/null || echo 0)
echo "@@rc $rc"; echo "@@st $st"; echo "@@size $s"
if [ "$s" -gt "$5" ]; then tail -c +$(($5 + 1)) -- "$4" | head -c $((s - $5)); fi
