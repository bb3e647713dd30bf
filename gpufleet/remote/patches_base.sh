#!/bin/bash
# Shared start of the patch scripts: g() runs git in $co; gf_tmp (makes $tmp, a directory removed on exit); gf_has,
# gf_root (the series' root in the tree: the first of $roots holding $probe) and gf_apply (git apply in a directory).
# Expects from the caller: co (the checkout), nock (exit code when $co is no git checkout; 0 for a status probe);
# a status probe also sets ref (origin's branch ref) and upref (a pinned commit).
set -u
export GIT_OPTIONAL_LOCKS=0  # a read never rewrites the checkout's index (it may belong to another user)
g() { git -c safe.directory='*' -c core.quotepath=false -C "$co" "$@"; }
if ! g rev-parse --git-dir >/dev/null 2>&1; then echo "@@error $co is not a git checkout"; exit "${nock:-0}"; fi
# $tmp, removed on exit, is made by gf_tmp where a script first needs it: a judgement the host remembers needs none
tmp=
gf_tmp() {
    [ -z "$tmp" ] || return 0
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-patches.XXXXXX") \
        || { echo "@@error cannot make a temporary directory"; exit "${nock:-0}"; }
    trap 'rm -rf "$tmp"' EXIT
    # git apply runs on copies under $tmp: never let it find a repository above them
    export GIT_CEILING_DIRECTORIES=$tmp
}
gf_has() {
    if [ "$1" = wt ]; then [ -e "$co/$2" ]; else g cat-file -e "${upref:-$ref}:$2" 2>/dev/null; fi
}
gf_root() {
    local r
    root=${roots[0]}
    for r in "${roots[@]}"; do if gf_has "$1" "${r:+$r/}$probe"; then root=$r; break; fi; done
    dirarg=()
    if [ -n "$root" ]; then dirarg=("--directory=$root"); fi
}
gf_apply() { (cd "$1" && git -c safe.directory='*' apply ${dirarg[@]+"${dirarg[@]}"} "${@:2}"); }
