#!/bin/bash
# Release the host's lock; only the run that took it removes it (its token is in the holder file). Always exits 0.
# Args: $1 the run's token, $2 lock directory.
grep -qxF "token=$1" "$2/holder" 2>/dev/null && rm -rf -- "$2"; exit 0
