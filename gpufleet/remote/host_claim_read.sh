#!/bin/bash
# Print the lock's holder file; exit 1 when the host is not locked. Read-only.
# Args: $1 lock directory.
[ -d "$1" ] || exit 1; cat -- "$1/holder" 2>/dev/null; exit 0
