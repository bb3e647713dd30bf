#!/bin/bash
# After a restore: the venv's packages, the checkout's HEAD and local edits must match the snapshot (exit 1 if not).
# Args: $1 snapshot dir, $2 venv, $3 checkout.
d=$1 venv=$2 co=$3
if [ -f "$d/pip-freeze.txt" ]; then
    (cd / && PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip freeze --all) > /tmp/gpufleet-freeze.$$ 2>&1
    if ! diff -u "$d/pip-freeze.txt" /tmp/gpufleet-freeze.$$; then rm -f /tmp/gpufleet-freeze.$$; exit 1; fi
    rm -f /tmp/gpufleet-freeze.$$
fi
export GIT_OPTIONAL_LOCKS=0  # a read never rewrites the checkout's index (it may belong to another user)
g() { git -c safe.directory='*' -C "$co" "$@"; }
if [ -f "$d/git-head" ]; then
    [ "$(g rev-parse HEAD)" = "$(cat "$d/git-head")" ] || { echo "HEAD is not $(cat "$d/git-head")"; exit 1; }
    g diff HEAD --binary | cmp -s - "$d/git.diff" || { echo "local edits differ from the snapshot"; exit 1; }
fi
echo "packages, HEAD and local edits match the snapshot"
