#!/bin/bash
# Take the host's gpufleet lock by an atomic mkdir and write the holder file into it.
# Args: $1 holder text, $2 lock directory, $3 exit code when another run holds it (then the holder file is printed).
# Exit 2: the state directory or the holder file could not be written.
lock=$2
mkdir -p -- "$(dirname -- "$lock")" || exit 2
if mkdir -- "$lock" 2>/dev/null; then
    printf '%s' "$1" > "$lock/holder" || { rm -rf -- "$lock"; exit 2; }
    exit 0
fi
cat -- "$lock/holder" 2>/dev/null
exit "$3"
