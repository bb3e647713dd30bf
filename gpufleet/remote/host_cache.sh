#!/bin/bash
# Where the host remembers reads (sent ahead of the scripts that do): gf_cache is $GPUFLEET_HOST_CACHE, else
# $XDG_CACHE_HOME/gpufleet, else ~/.cache/gpufleet, as stack_memo.py finds it; empty when none can be named (then
# nothing is remembered and every read is done afresh).
gf_cache=
if [ -n "${GPUFLEET_HOST_CACHE:-}" ]; then gf_cache=$GPUFLEET_HOST_CACHE
elif [ -n "${XDG_CACHE_HOME:-}" ]; then gf_cache=$XDG_CACHE_HOME/gpufleet
elif [ -n "${HOME:-}" ]; then gf_cache=$HOME/.cache/gpufleet
fi
# gf_keep DIR NAME < TEXT: remember TEXT as DIR/NAME, written aside and renamed (a reader never sees half of it);
# entries untouched for 30 days go. Best effort: a cache that cannot be written only means reading afresh next time.
gf_keep() {
    {
        mkdir -p -m 700 "$1" && cat > "$1/.$2.$$" && mv -f "$1/.$2.$$" "$1/$2"
        find "$1" -maxdepth 1 -type f -mtime +30 -delete
    } 2>/dev/null || true
}
