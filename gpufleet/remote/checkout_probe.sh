#!/bin/bash
# Read-only: `remote=SHA` of origin's branch (ls-remote), and `contained=yes` when HEAD already contains it.
# Exit 2 when ls-remote fails. Sent after checkout_prelude.sh; expects co and branch.
sha=$(timeout 120 git -c safe.directory='*' -C "$co" ls-remote --exit-code origin "refs/heads/$branch") || exit 2
sha=${sha%%[[:space:]]*}  # the first field of the first line (was `cut -f1`: one process less)
echo "remote=$sha"
if g cat-file -e "$sha^{commit}" 2>/dev/null && g merge-base --is-ancestor "$sha" HEAD 2>/dev/null; then
    echo "contained=yes"
fi
