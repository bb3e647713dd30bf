#!/bin/bash
# Keep the newest snapshots (by their stamp names) and the one named to keep; remove the rest; print each removed path.
# Args: $1 snapshots directory, $2 how many to keep (>= 1), $3 a snapshot never removed (the one this run took).
set -u
base=$1 keep=$2 protect=${3%/}
[ -d "$base" ] || exit 0
# only what snapshot.sh made (it writes manifest.json first) counts and is removed
ls -1d "$base"/*/manifest.json 2>/dev/null | sed 's:/manifest.json$::' | sort | head -n "-$keep" | while IFS= read -r d; do
    [ "$d" = "$protect" ] && continue
    rm -rf -- "$d" && echo "$d"
done
exit 0
