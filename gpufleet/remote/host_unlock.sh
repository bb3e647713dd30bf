#!/bin/bash
# Break the host's lock for `inv unlock`: remove it only while it is still the claim that was shown (same token; a
# lock with no token in its holder file is matched by having none), so a run that took the lock since is never hit.
# Args: $1 lock directory, $2 the token shown (empty: the shown lock had none). Exit 0 removed or already free,
# 1 the lock changed hands meanwhile.
lock=$1 token=$2
[ -d "$lock" ] || exit 0
if [ -n "$token" ]; then
    grep -qxF "token=$token" "$lock/holder" 2>/dev/null || exit 1
else
    ! grep -q '^token=' "$lock/holder" 2>/dev/null || exit 1
fi
rm -rf -- "$lock"
