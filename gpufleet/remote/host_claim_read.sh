#!/bin/bash
# Print the lock's holder file, then a last line `@@boot_now=<the host's boot id now>`; exit 1 when the host is not
# locked. Read-only.
# Args: $1 lock directory.
[ -d "$1" ] || exit 1
cat -- "$1/holder" 2>/dev/null
printf '\n@@boot_now=%s\n' "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
exit 0
