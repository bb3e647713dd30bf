#!/bin/bash
# Exit 0 when the checkout is at target (pinned: HEAD starts with it, a pin may be a short sha) or contains it
# (latest), with no update left half-done (marker file) and no unmerged files.
# Sent after checkout_prelude.sh; expects co, target, pinned (1/0), marker_name.
[ ! -e "$(g rev-parse --absolute-git-dir)/$marker_name" ] && [ -z "$(g ls-files -u)" ] || exit 1
if [ "$pinned" = 1 ]; then
    h=$(g rev-parse HEAD) && [ "${h#"$target"}" != "$h" ]
else
    g merge-base --is-ancestor "$target" HEAD
fi
