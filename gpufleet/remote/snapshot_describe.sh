#!/bin/bash
# Describe a snapshot: its manifest.json on the first line, then key=value lines; exit 2 when it is not one.
# Args: $1 the snapshot directory.
d=$1
[ -f "$d/manifest.json" ] || exit 2
cat "$d/manifest.json"; echo
printf 'venv=%s\n' "$([ -d "$d/venv" ] && echo yes || echo no)"
printf 'git_head=%s\n' "$(cat "$d/git-head" 2>/dev/null)"
printf 'git_branch=%s\n' "$(cat "$d/git-branch" 2>/dev/null)"
printf 'diff_lines=%s\n' "$(wc -l < "$d/git.diff" 2>/dev/null || echo 0)"
printf 'untracked=%s\n' "$(wc -l < "$d/untracked.txt" 2>/dev/null || echo 0)"
printf 'unit_path=%s\n' "$(cat "$d/unit-path" 2>/dev/null)"
printf 'unit_active=%s\n' "$(cat "$d/unit-active" 2>/dev/null)"
