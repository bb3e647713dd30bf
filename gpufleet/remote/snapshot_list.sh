#!/bin/bash
# List the snapshots, oldest first: `@@snapshot PATH KIB` (its size on its own) then its manifest line; finally
# `@@total KIB`, all of them together (the hard-linked venv files they share counted once). Read-only.
# Args: $1 snapshots directory.
base=$1
dirs=()
while IFS= read -r d; do dirs+=("$d"); done < <(ls -1d "$base"/*/ 2>/dev/null | sed 's:/$::' | sort)
for d in "${dirs[@]}"; do
    printf '@@snapshot %s %s\n' "$d" "$(du -sk -- "$d" 2>/dev/null | cut -f1)"
    head -n 1 -- "$d/manifest.json" 2>/dev/null; echo
done
if [ ${#dirs[@]} -gt 0 ]; then printf '@@total %s\n' "$(du -skc -- "${dirs[@]}" 2>/dev/null | tail -n 1 | cut -f1)"; fi
exit 0
