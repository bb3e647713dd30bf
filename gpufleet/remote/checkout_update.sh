#!/bin/bash
# Update the sglang checkout: back up and stash local edits, fast-forward to the target, pop the stash; on any
# failure put the checkout back exactly as it was. Sent after checkout_prelude.sh.
# Expects: co, branch, target ("" = origin's branch tip), pinned (1/0), backups (directory for backups),
# marker_name (file in the git dir while an update runs), exit_restored, exit_refused, exit_not_restored.
# Finish, or put the checkout back, even when the SSH connection drops mid-way.
trap '' HUP
say() { echo "gpufleet: $*"; }
refuse() { say "$* (nothing was changed)"; exit "$exit_refused"; }
status_now() { g status --porcelain=v1 --untracked-files=all; }
stashes_now() { g stash list --format=%H; }
drop_stash() {
    local ref
    ref=$(g stash list --format='%gd %H' | awk -v s="$1" '$2 == s { print $1; exit }')
    [ -n "$ref" ] && g stash drop -q "$ref"
}
restore() {
    # Back to the state before: HEAD $old, then the stash (made on $old, so it applies cleanly) with its index.
    g reset -q --hard "$old" || return 1
    g clean -q -fd || return 1
    if [ -n "$st" ]; then g stash apply -q --index "$st" && drop_stash "$st" || return 1; fi
    [ "$(g rev-parse HEAD)" = "$old" ] || return 1
    if [ -n "${checked-}" ]; then
        [ "$(status_now)" = "$before_status" ] && [ "$(stashes_now)" = "$before_stashes" ] || return 1
    fi
}
fail() {
    say "$*"
    if restore; then
        rm -f "$marker"
        say "the checkout is back exactly as it was: HEAD $old, local edits and stash list" \
            "unchanged${base:+; backup: $base.patch}"
        exit "$exit_restored"
    fi
    say "COULD NOT put the checkout back exactly: HEAD was $old${st:+, your edits are in stash $st (gpufleet $ts)}," \
        "${base:+backup: $base.patch,} left $marker for the next run"
    exit "$exit_not_restored"
}

g rev-parse --git-dir >/dev/null 2>&1 || refuse "$co is not a git checkout"
gitdir=$(g rev-parse --absolute-git-dir)
marker=$gitdir/$marker_name
base= st= ts= old=
if [ -z "$(g config user.name)" ] || [ -z "$(g config user.email)" ]; then
    # git stash makes commits; an operator's box may have no identity configured
    export GIT_AUTHOR_NAME=gpufleet GIT_AUTHOR_EMAIL=gpufleet@localhost
    export GIT_COMMITTER_NAME=gpufleet GIT_COMMITTER_EMAIL=gpufleet@localhost
fi

if [ -f "$marker" ]; then
    old=$(sed -n 's/^head=//p' "$marker"); st=$(sed -n 's/^stash=//p' "$marker"); ts=$(sed -n 's/^ts=//p' "$marker")
    if [ -n "$st" ] && stashes_now | grep -qx "$st"; then
        if [ -n "$(status_now)" ]; then
            say "an earlier update was cut short: its stash $st (gpufleet $ts) is still in the stash list and" \
                "the checkout has changes; compare them (git stash show -p $st), drop or pop the stash, then" \
                "remove $marker"
            exit "$exit_refused"
        fi
        say "an earlier update was cut short after stashing: putting the checkout back to $old first"
        restore || fail "could not undo the earlier, cut-short update"
    fi
    rm -f "$marker"
    st= ts= old=
fi

cur=$(g symbolic-ref --short -q HEAD) || cur=
[ "$cur" = "$branch" ] || refuse "the checkout is on ${cur:-a detached HEAD}, not $branch: switch it yourself"
[ -z "$(g ls-files -u)" ] \
    || refuse "the checkout has unmerged files (an unfinished merge or stash pop): resolve them first"
for f in MERGE_HEAD CHERRY_PICK_HEAD REVERT_HEAD rebase-merge rebase-apply; do
    [ ! -e "$gitdir/$f" ] || refuse "an unfinished git operation ($f) is in progress"
done

out=$(timeout 900 git -c safe.directory='*' -C "$co" fetch -q origin \
        "+refs/heads/$branch:refs/remotes/origin/$branch" 2>&1) \
    || refuse "git fetch origin $branch failed: $out"
if [ -n "$target" ]; then
    want=$(g rev-parse -q --verify "$target^{commit}") \
        || { g fetch -q origin "$target" >/dev/null 2>&1; want=$(g rev-parse -q --verify "$target^{commit}"); } \
        || refuse "commit $target is not on origin"
else
    want=$(g rev-parse -q --verify "refs/remotes/origin/$branch^{commit}") || refuse "origin has no branch $branch"
fi
old=$(g rev-parse HEAD)
if [ "$old" = "$want" ]; then say "$branch is already at $want"; exit 0; fi
if g merge-base --is-ancestor "$want" HEAD; then
    [ "$pinned" = 0 ] || refuse "HEAD $old is newer than the pinned commit $want; going back is not a" \
        "fast-forward: check the pin out yourself"
    say "HEAD $old already contains $want (local commits on top): nothing to pull"; exit 0
fi
g merge-base --is-ancestor HEAD "$want" \
    || refuse "cannot fast-forward $branch from $old to $want: the checkout has" \
        "$(g rev-list --count "$want..HEAD") commit(s) upstream does not have (git pull --ff-only would fail)"

before_status=$(status_now); before_stashes=$(stashes_now); checked=1
if [ -n "$before_status" ]; then
    ts=$(date -u +%Y%m%dT%H%M%SZ)
    base=$backups/sglang-$ts
    [ ! -e "$base.patch" ] || base=$base-$$
    mkdir -p "$backups" && chmod 700 "$backups" || refuse "cannot create $backups"
    g diff --binary HEAD > "$base.patch" || refuse "could not write $base.patch"
    if [ -n "$(g ls-files --others --exclude-standard)" ]; then
        (cd "$co" && git -c safe.directory='*' ls-files -z --others --exclude-standard \
            | tar --null -T - -cf "$base.untracked.tar") \
            || refuse "could not write $base.untracked.tar"
    fi
    printf 'checkout=%s\nbranch=%s\nhead=%s\ntarget=%s\nstatus:\n%s\n' \
        "$co" "$branch" "$old" "$want" "$before_status" > "$base.info"
    say "local edits backed up: $base.patch$([ ! -e "$base.untracked.tar" ] || echo " and $base.untracked.tar")"
fi
printf 'head=%s\nstash=\nts=%s\n' "$old" "$ts" > "$marker" || refuse "cannot write $marker"
if [ -n "$before_status" ]; then
    if ! out=$(g stash push -q --include-untracked -m "gpufleet $ts" 2>&1); then
        [ "$(stashes_now)" != "$before_stashes" ] || { rm -f "$marker"; refuse "git stash failed: $out"; }
        st=$(g rev-parse -q --verify refs/stash)
        fail "git stash failed: $out"
    fi
    st=$(g rev-parse -q --verify refs/stash)
    printf 'head=%s\nstash=%s\nts=%s\n' "$old" "$st" "$ts" > "$marker"
    [ -z "$(status_now)" ] || fail "git stash left changes behind: $(status_now | head -n 5 | tr '\n' ' ')"
fi
out=$(g merge --ff-only -q "$want" 2>&1) || fail "git merge --ff-only $want failed: $out"
if [ -n "$st" ]; then
    if ! out=$(g stash apply "$st" 2>&1); then
        files=$(g diff --name-only --diff-filter=U | paste -sd ' ' -)
        why=$(printf '%s\n' "$out" | grep -E 'CONFLICT|error|exists' | head -n 4 | tr '\n' ' ')
        fail "the local edits conflict with upstream $want${files:+ in $files}: ${why}(redo the edit on top of" \
            "upstream, or drop it if upstream has it: \`inv patches\` tells)"
    fi
    drop_stash "$st" || say "warning: could not drop the applied stash $st (gpufleet $ts)"
fi
rm -f "$marker"
say "updated $branch: $old -> $want${st:+; local edits restored (backup: $base.patch)}"
