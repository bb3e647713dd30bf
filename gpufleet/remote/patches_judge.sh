#!/bin/bash
# The patch judging library (sent after patches_base.sh): prints `@@head SHA`, then the caller's calls print
# `@@fetch rc=N ...` (gf_fetch BRANCH), and per patch and tree `@@judge TREE SERIES PATCH fwd=N rev=N root=R`,
# git apply's complaints as `|` lines, and `@@file pre|post PATH` + base64 of the files an effect check reads.
# Expects co, ref (and upref) set; per series roots, probe, paths; per patch effect.
# a status probe must never wait for a password or a host-key prompt
export GIT_TERMINAL_PROMPT=0 GIT_SSH_COMMAND="${GIT_SSH_COMMAND:-ssh -o BatchMode=yes}"
echo "@@head $(g rev-parse -q --verify HEAD)"
gf_fetch() {
    local out rc
    # a read runs no repository maintenance (git's own `maintenance run --auto` after a fetch; gc.auto before 2.29)
    out=$(timeout 300 git -c safe.directory='*' -c maintenance.auto=false -c gc.auto=0 -C "$co" \
        fetch -q origin "+refs/heads/$1:$ref" 2>&1); rc=$?
    out=${out//$'\n'/ }
    echo "@@fetch rc=$rc ${out:0:300}"
}
gf_copy() {
    gf_has "$1" "$3" || return 0
    if [ "$1" = wt ]; then tar -C "$co" -cf - --exclude=__pycache__ -- "$3"
    else g archive --format=tar "${upref:-$ref}" -- "$3"; fi | tar -xf - -C "$2"
}
gf_dump() {
    local f
    grep -rlF --include='*.py' -- "$effect" "$2" 2>/dev/null | sort | while IFS= read -r f; do
        echo "@@file $1 ${f#"$2"/}"; base64 -w0 < "$f"; echo
    done
}
gf_tree() {
    local p
    gf_root "$1"
    d=$tmp/$1-$2
    rm -rf "$d"; mkdir -p "$d"
    for p in "${paths[@]}"; do gf_copy "$1" "$d" "${root:+$root/}$p"; done
}
gf_judge() {
    local fwd rev
    gf_apply "$d" --check "$4" >"$tmp/fwd" 2>&1; fwd=$?
    gf_apply "$d" --reverse --check "$4" >/dev/null 2>&1; rev=$?
    echo "@@judge $1 $2 $3 fwd=$fwd rev=$rev root=$root"
    sed 's/^/|/' "$tmp/fwd"
    [ -z "$effect" ] || gf_dump pre "$d"
    # Later patches of a series are judged on the tree with the earlier ones applied, as a build would see it.
    if [ "$rev" != 0 ] && [ "$fwd" = 0 ] && gf_apply "$d" "$4" >/dev/null 2>&1 && [ -n "$effect" ]; then
        gf_dump post "$d"
    fi
}
