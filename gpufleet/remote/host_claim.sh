#!/bin/bash
# Take the host's gpufleet lock by an atomic mkdir and write the holder file into it, with the host's boot id (a lock
# from an earlier boot of the host is stale whoever took it).
# Args: $1 holder text, $2 lock directory, $3 exit code when another run holds it (then the holder file is printed,
# and a last line `@@boot_now=<the host's boot id now>`).
# Exit 2: the state directory or the holder file could not be written.
lock=$2
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)
mkdir -p -- "$(dirname -- "$lock")" || exit 2
if mkdir -- "$lock" 2>/dev/null; then
    printf '%sboot_id=%s\n' "$1" "$boot" > "$lock/holder" || { rm -rf -- "$lock"; exit 2; }
    exit 0
fi
cat -- "$lock/holder" 2>/dev/null
printf '\n@@boot_now=%s\n' "$boot"
exit "$3"
