#!/bin/bash
# The model check's report, remembered on the host (sent after host_cache.sh): the same check (its digest) on a model
# directory whose entries are unchanged (listed by name, type, size, mtime, ctime, inode and link target, the
# directory's own line first) gives the same report. A checkpoint's headers and index are tens of MB of JSON (93 MB
# for one shaped like Qwen3.5-397B-A17B-NVFP4: 0.8 s of CPU to parse, bench/model_check_cost.py); the listing and
# its digest take a few ms.
# Args: $1 model directory, $2 the venv's python, $3 model_check.py's source, $4 its digest. Prints what
# `python -E -S -c CHECK DIR report` prints, with its exit code.
dir=$1 py=$2 check=$3 digest=$4 key= listing=
if [ -n "$gf_cache" ]; then
    # nothing listed: no such directory, or a find without -printf (not GNU): check afresh
    # -L: a shard that is a link (a Hugging Face snapshot's are) is listed by the file it names, and by that name
    listing=$(find -L "$dir" -maxdepth 1 -printf '%f %y %s %T@ %C@ %i %l\n' 2>/dev/null)
    [ -z "$listing" ] || key=$(printf '%s\n' "$digest" "$dir" "$listing" | sha256sum) || key=
    key=${key:0:64}
fi
memo=$gf_cache/model-checks/$key
if [ -n "$key" ] && [ -f "$memo" ]; then
    out=
    IFS= read -r -d '' out <"$memo"
    printf '%s' "$out"
    exit 0
fi
out=$(cd / && "$py" -E -S -c "$check" "$dir" report 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ] && [ -n "$key" ] && [[ $out == @@gpufleet-model\ * ]]; then
    gf_keep "$gf_cache/model-checks" "$key" <<<"$out"
fi
exit "$rc"
