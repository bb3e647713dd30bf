#!/bin/bash
# Restore a snapshot: venv, checkout HEAD with its local edits and untracked files, unit and its env file.
# Args: $1 snapshot dir, $2 venv, $3 checkout, $4 unit, $5 the text of venv_stage.py (the one swap in one step).
# Exit 2 no such snapshot, 3 venv, 4 checkout, 5 unit.
set -u
d=$1 venv=$2 co=$3 unit=$4 stage_py=${5:-}
[ -f "$d/manifest.json" ] || exit 2
systemctl stop -- "$unit" 2>/dev/null || true
if [ -d "$d/venv" ]; then
    # Swap in a hard-linked copy (the snapshot stays intact for another rollback); keep the replaced venv until
    # the copy is complete so a failure here leaves a working venv behind.
    rm -rf -- "$venv.gpufleet-new" "$venv.gpufleet-old"
    cp -al -- "$d/venv" "$venv.gpufleet-new" 2>/dev/null || cp -a -- "$d/venv" "$venv.gpufleet-new" || exit 3
    # One atomic exchange where the filesystem can (exit 7: it cannot, e.g. overlayfs without redirect_dir): the
    # venv path never names a half-restored tree; else two moves, which mv can do across layers.
    if [ -e "$venv" ] && [ -n "$stage_py" ] && (cd / && python3 -c "$stage_py" swap-in "$venv" "$venv.gpufleet-new"); then
        :
    else
        if [ -e "$venv" ]; then mv -- "$venv" "$venv.gpufleet-old" || exit 3; fi
        mv -- "$venv.gpufleet-new" "$venv" || { mv -- "$venv.gpufleet-old" "$venv"; exit 3; }
        rm -rf -- "$venv.gpufleet-old"
    fi
fi
g() { git -c safe.directory='*' -c core.quotepath=false -C "$co" "$@"; }
if [ -f "$d/git-head" ]; then
    head=$(cat "$d/git-head"); branch=$(cat "$d/git-branch" 2>/dev/null)
    g reset -q --hard || exit 4
    g clean -q -fd || exit 4
    if [ -n "$branch" ]; then g checkout -q "$branch" || exit 4; fi
    g reset -q --hard "$head" || exit 4
    if [ -s "$d/git.diff" ]; then g apply --binary "$d/git.diff" || exit 4; fi
    if [ -f "$d/untracked.tar.gz" ]; then tar -C "$co" -xzf "$d/untracked.tar.gz" || exit 4; fi
fi
current=$(systemctl show -p FragmentPath --value -- "$unit" 2>/dev/null)
[ -n "$current" ] || current=/etc/systemd/system/$unit
env_file=/etc/gpufleet/${unit%.service}.env
if [ -f "$d/unit-path" ]; then
    cp -p -- "$d/$(basename "$(cat "$d/unit-path")")" "$(cat "$d/unit-path")" || exit 5
    if [ -f "$d/unit.env" ]; then cp -p -- "$d/unit.env" "$env_file" || exit 5; fi
else
    # The unit did not exist before the upgrade.
    systemctl disable -- "$unit" 2>/dev/null || true
    rm -f -- "$current" "$env_file"
fi
systemctl daemon-reload 2>/dev/null || true
if [ "$(cat "$d/unit-active" 2>/dev/null)" = active ]; then systemctl start -- "$unit" || exit 5; fi
echo restored
