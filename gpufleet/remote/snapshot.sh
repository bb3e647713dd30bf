#!/bin/bash
# Save what a rollback needs under /var/lib/gpufleet/snapshots/STAMP: pip freeze, a hard-linked copy of the venv,
# the checkout's HEAD, diff and untracked files, the unit file and its environment file; print the snapshot's path.
# Args: $1 venv, $2 checkout, $3 unit, $4 stamp, $5 manifest JSON.
set -u
venv=$1 co=$2 unit=$3 stamp=$4 manifest=$5
base=/var/lib/gpufleet/snapshots
mkdir -p "$base" || exit 2
d="$base/$stamp" n=1
while ! mkdir "$d" 2>/dev/null; do d="$base/$stamp-$n"; n=$((n + 1)); [ $n -lt 100 ] || exit 2; done
chmod 700 "$d"  # it may hold the server's environment file (secrets)
printf '%s\n' "$manifest" > "$d/manifest.json"
if [ -x "$venv/bin/python" ]; then
    if (cd / && "$venv/bin/python" -m pip --version) >/dev/null 2>&1; then
        (cd / && PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip freeze --all) > "$d/pip-freeze.txt" || exit 4
    elif command -v uv >/dev/null 2>&1; then
        uv pip freeze --python "$venv/bin/python" > "$d/pip-freeze.txt" || exit 4
    else
        (cd / && "$venv/bin/python" -c 'import importlib.metadata as m
for d in sorted(m.distributions(), key=lambda d: d.metadata["Name"].lower()):
    print("%s==%s" % (d.metadata["Name"], d.version))') > "$d/pip-freeze.txt" || exit 4
    fi
fi
# The venv itself, hard-linked: pip and uv replace files rather than rewrite them, so the snapshot keeps the exact
# old files (a source-built sgl-kernel, a nightly torch that has left its index) at almost no disk cost.
if [ -d "$venv" ]; then
    cp -al -- "$venv" "$d/venv" 2>/dev/null || { rm -rf -- "$d/venv"; cp -a -- "$venv" "$d/venv"; } || exit 6
fi
export GIT_OPTIONAL_LOCKS=0  # a read never rewrites the checkout's index (it may belong to another user)
g() { git -c safe.directory='*' -c core.quotepath=false -C "$co" "$@"; }
if [ -d "$co" ] && [ "$(g rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$co" && pwd -P)" ]; then
    g rev-parse HEAD > "$d/git-head" || exit 5
    g symbolic-ref -q --short HEAD > "$d/git-branch" || true
    g diff HEAD --binary > "$d/git.diff" || exit 5
    g stash list > "$d/git-stash-list" || true
    g ls-files --others --exclude-standard -z > "$d/untracked.z" || exit 5
    tr '\0' '\n' < "$d/untracked.z" > "$d/untracked.txt"
    if [ -s "$d/untracked.z" ]; then tar -C "$co" --null -T "$d/untracked.z" -czf "$d/untracked.tar.gz" || exit 5; fi
    rm -f "$d/untracked.z"
fi
path=
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    path=$(systemctl show -p FragmentPath --value -- "$unit" 2>/dev/null)
fi
if [ -z "$path" ] && [ -f "/etc/systemd/system/$unit" ]; then path=/etc/systemd/system/$unit; fi
if [ -n "$path" ] && [ -f "$path" ]; then cp -p -- "$path" "$d/" && printf '%s\n' "$path" > "$d/unit-path"; fi
for f in "/etc/gpufleet/${unit%.service}.env"; do [ -f "$f" ] && cp -p -- "$f" "$d/unit.env"; done
systemctl is-active -- "$unit" > "$d/unit-active" 2>/dev/null || true
# Old snapshots are pruned after a successful run (snapshot_prune.sh, inventory settings.snapshots_keep).
echo "$d"
