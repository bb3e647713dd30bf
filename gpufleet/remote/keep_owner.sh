#!/bin/bash
# Run a command, then hand back to each path's owner what root created under it (a venv or a checkout that belongs
# to the login user keeps that owner; git and pip as root would leave root-owned files in it). The owner is read
# before the command runs (for a path not there yet: its parent directory's). Acts only when running as root and
# the owner is not root, so a root-owned path is left exactly as before. The command's exit code is kept.
# Args: PATH... -- COMMAND_TEXT (shell text, run by bash -c).
paths=(); while [ "$#" -gt 0 ] && [ "$1" != -- ]; do paths+=("$1"); shift; done; shift
owners=()
for p in "${paths[@]}"; do
    o=$(stat -c %u:%g -- "$p" 2>/dev/null || stat -c %u:%g -- "$(dirname -- "$p")" 2>/dev/null)
    owners+=("$o")
done
bash -c "$1"; rc=$?
if [ "$(id -u)" = 0 ]; then
    for i in "${!paths[@]}"; do
        o=${owners[$i]}
        if [ -n "$o" ] && [ "${o%%:*}" != 0 ] && [ -e "${paths[$i]}" ]; then
            chown -R -h --from=0 "$o" -- "${paths[$i]}" || echo "gpufleet: could not give ${paths[$i]} back to $o"
        fi
    done
fi
exit $rc
