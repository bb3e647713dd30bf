#!/bin/bash
# The patch judgement remembered on the host (sent after patches_judge.sh and host_cache.sh): the same judging
# script (its digest, in $1 of gf_memo_key), on the same files of the checkout (listed by path, type, size, mtime,
# ctime and inode, as git's own index tells a file changed) and the same upstream commit, judged by the same git
# binary, gives the same verdicts.
# Expects co, upstream and watched (the paths under $co the judgement reads, every root and path of every series).
gf_memo_dir=${gf_cache:+$gf_cache/patch-judgements}
gf_memo_key() {
    local sum listing git_bin=${BASH_CMDS[git]:-}
    [ -n "$gf_memo_dir" ] && [ -n "$upstream" ] || return 1  # no upstream to judge against: judge afresh every time
    # the same git: the binary bash ran for g (its hash table; -H: through a link, as an upgrade replaces the file),
    # listed with the paths, where `git --version` was a process of its own; asked only when bash kept no path
    listing=$(find -H "${watched[@]/#/$co/}" ${git_bin:+"$git_bin"} -name __pycache__ -prune \
        -o -printf '%p %y %s %T@ %C@ %i\n' 2>/dev/null)
    # nothing listed: none of the paths is there, or a find without -printf (not GNU): judge afresh every time
    [ -n "$listing" ] || return 1
    sum=$({ printf '%s\n' "$1" "$co" "$upstream" "$listing"; [ -n "$git_bin" ] || git --version; } | sha256sum) \
        || return 1
    printf '%s\n' "${sum:0:64}"
}
gf_memo_print() {
    local text=
    IFS= read -r -d '' text <"$gf_memo_dir/$1"  # a bash builtin: no `cat` process
    printf '%s' "$text"
    echo "@@memo $1"
}
gf_memo_keep() {
    gf_keep "$gf_memo_dir" "$1" <"$tmp/judged"
}
