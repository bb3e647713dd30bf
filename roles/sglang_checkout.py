"""Role: keep the sglang source checkout on upstream's branch (stash, fast-forward, pop; put back on failure)."""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import replace
from urllib.parse import urlsplit

from gpufleet.engine.command import Cmd, script
from gpufleet.facts.checkout import redact_url
from gpufleet.plan import PlanContext, PlanError, Step, Unchanged
from gpufleet.roleapi import Cell, Column, Declares, Package
from gpufleet.roles import patches as series_mod

name = "sglang-checkout"
BACKUPS = "/var/lib/gpufleet/backups"
MARKER = "gpufleet-update"  # in the checkout's git dir while an update runs; a leftover one means it was cut short
UPDATE_TIMEOUT = 1800.0
EXIT_RESTORED, EXIT_REFUSED, EXIT_NOT_RESTORED = 2, 3, 4

_PRELUDE = r"""
set -u
g() { git -c safe.directory='*' -c core.quotepath=false -C "$co" "$@"; }
# never wait for a password or a host-key prompt
export GIT_TERMINAL_PROMPT=0 GIT_SSH_COMMAND="${GIT_SSH_COMMAND:-ssh -o BatchMode=yes}"
"""

_UPDATE = r"""
# Finish, or put the checkout back, even when the SSH connection drops mid-way.
trap '' HUP
say() { echo "gpufleet: $*"; }
refuse() { say "$* (nothing was changed)"; exit @REFUSED@; }
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
        exit @RESTORED@
    fi
    say "COULD NOT put the checkout back exactly: HEAD was $old${st:+, your edits are in stash $st (gpufleet $ts)}," \
        "${base:+backup: $base.patch,} left $marker for the next run"
    exit @NOT_RESTORED@
}

g rev-parse --git-dir >/dev/null 2>&1 || refuse "$co is not a git checkout"
gitdir=$(g rev-parse --absolute-git-dir)
marker=$gitdir/@MARKER@
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
            exit @REFUSED@
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
"""


def _vars(**values: str) -> str:
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items())


def update_script(checkout: str, branch: str, target: str = "", pinned: bool = False,
                  backups: str | None = None) -> str:
    """Bash for the stash / fast-forward / pop flow; target "" means origin's branch tip at run time."""
    backups = backups or BACKUPS
    body = (_UPDATE.replace("@REFUSED@", str(EXIT_REFUSED)).replace("@RESTORED@", str(EXIT_RESTORED))
            .replace("@NOT_RESTORED@", str(EXIT_NOT_RESTORED)).replace("@MARKER@", MARKER))
    head = _vars(co=checkout, branch=branch, target=target, pinned="1" if pinned else "0", backups=backups)
    return head + _PRELUDE + body


def update_command(checkout: str, branch: str, target: str = "", pinned: bool = False) -> Cmd:
    return script(update_script(checkout, branch, target, pinned))


def probe_command(checkout: str, branch: str) -> Cmd:
    """Read-only: the sha of origin's branch (ls-remote) and whether HEAD already contains it."""
    return script(_vars(co=checkout, branch=branch) + _PRELUDE + r"""
set -o pipefail
sha=$(timeout 120 git -c safe.directory='*' -C "$co" ls-remote --exit-code origin "refs/heads/$branch" | cut -f1) \
    || exit 2
echo "remote=$sha"
if g cat-file -e "$sha^{commit}" 2>/dev/null && g merge-base --is-ancestor "$sha" HEAD 2>/dev/null; then
    echo "contained=yes"
fi
""")


def done_command(checkout: str, target: str, pinned: bool) -> Cmd:
    """Exit 0 when the checkout is at target (pinned) or contains it (latest), with no update left half-done."""
    # a pin may be a short sha: HEAD must start with it
    test = ('h=$(g rev-parse HEAD) && [ "${h#"$target"}" != "$h" ]' if pinned
            else 'g merge-base --is-ancestor "$target" HEAD')
    return script(_vars(co=checkout, target=target) + _PRELUDE + f"""
[ ! -e "$(g rev-parse --absolute-git-dir)/{MARKER}" ] && [ -z "$(g ls-files -u)" ] && {test}
""")


def needed_command(checkout: str, target: str, pinned: bool) -> Cmd:
    """Exit 0 while the update is still needed, 1 once the checkout is at its target."""
    done = done_command(checkout, target, pinned)
    return script(f"if {done.render()}; then exit 1; fi; exit 0")


def clone_command(checkout: str, remote: str, branch: str, pin: str | None) -> Cmd:
    parts = [f"mkdir -p {shlex.quote(posixpath.dirname(checkout))}",
             Cmd.of("git", "clone", "-q", "--branch", branch, "--", remote, checkout).render()]
    if pin:
        parts.append(Cmd.of("git", "-C", checkout, "reset", "-q", "--hard", pin).render())
    return script(" && ".join(parts))


def normalise_remote(url: str) -> str:
    """A remote URL reduced to host/path: scheme, credentials, port, `.git` and scp syntax do not matter."""
    url = redact_url(url.strip())
    if "://" not in url and re.match(r"^[^/]+@?[^/]*:", url):
        url = "ssh://" + url.replace(":", "/", 1)
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    path = parts.path.rstrip("/").removesuffix(".git").lstrip("/")
    return f"{host}/{path}" if host else path


def _target(ctx: PlanContext, checkout: str, branch: str) -> tuple[str, bool]:
    """(upstream sha or "" when not probed, whether HEAD already contains it)."""
    if ctx.read is None:
        return "", False
    result = ctx.read(probe_command(checkout, branch), "probe upstream sglang")
    values = dict(line.split("=", 1) for line in result.output.splitlines() if "=" in line)
    sha = values.get("remote", "")
    if result.exit_code != 0 or not re.fullmatch(r"[0-9a-f]{40}", sha):
        raise PlanError(ctx.host.name, name, f"cannot read origin's {branch} (git ls-remote exited "
                                             f"{result.exit_code}): {result.tail(3)}")
    return sha, values.get("contained") == "yes"


def _edits(co) -> str:
    n = len(co.modified) + len(co.untracked)
    return f"{n} local edit(s) kept (backed up, stashed, restored)" if n else "no local edits"


def plan_update(ctx: PlanContext) -> list[Step | Unchanged]:
    """The clone, the fast-forward, or why neither is needed."""
    host, want = ctx.host, ctx.stack.sglang
    co = ctx.facts.checkout
    path = host.sglang_checkout
    pin = None if want.commit == "latest" else want.commit
    if co is None:
        raise PlanError(host.name, name, "the checkout facts could not be read (see `inv facts`)")
    if not co.present:
        if co.exists:
            raise PlanError(host.name, name, f"{path} exists but is not the top of a git checkout: "
                                             "refusing to touch it")
        return [Step(name, f"clone sglang {want.branch} into {path}", f"no checkout at {path}",
                     (clone_command(path, want.remote, want.branch, pin),),
                     verify=(done_command(path, pin, True),) if pin else (), timeout=UPDATE_TIMEOUT,
                     changes=("checkout",))]
    if co.branch != want.branch:
        raise PlanError(host.name, name, f"{path} is on {co.branch or 'a detached HEAD'}, stack.toml wants branch "
                                         f"{want.branch}: switch it yourself")
    if co.remote_url and normalise_remote(co.remote_url) != normalise_remote(want.remote):
        raise PlanError(host.name, name, f"origin of {path} is {co.remote_url}, stack.toml wants "
                                         f"{redact_url(want.remote)}: change one of them (git remote set-url origin)")
    head = co.head or ""
    if pin:
        if head.startswith(pin):
            return [Unchanged(name, f"{want.branch}@{head[:10]} is the pinned commit")]
        target, contained = pin, False
    else:
        target, contained = _target(ctx, path, want.branch)
        if target and head == target:
            return [Unchanged(name, f"{want.branch}@{head[:10]} is upstream's tip")]
        if contained:
            return [Unchanged(name, f"{want.branch}@{head[:10]} already contains upstream's tip {target[:10]} "
                                    f"(local commits on top)")]
    shown = target[:10] if target else f"origin/{want.branch}"
    reason = f"checkout at {head[:10]}, {'stack.toml pins' if pin else 'upstream is at'} {shown}; {_edits(co)}"
    verify = (done_command(path, target, bool(pin)),) if target else ()
    return [Step(name, f"update sglang checkout {head[:10]} -> {shown}", reason,
                 (update_command(path, want.branch, target, bool(pin)),),
                 needed=needed_command(path, target, bool(pin)) if target else None,
                 verify=verify, timeout=UPDATE_TIMEOUT, changes=("checkout",))]


def patch_status(ctx: PlanContext, series, target: str = "") -> "series_mod.HostPatches | None":
    """Each patch judged on the checkout and on upstream's branch, or on `target` (a pinned commit): one read-only
    probe; None without a probe."""
    series = [series] if isinstance(series, series_mod.Series) else [s for s in series if s.patches]
    if not any(s.patches for s in series) or ctx.read is None:
        return None
    cmd = series_mod.status_command(ctx.host.sglang_checkout, ctx.stack.sglang.branch, series, target=target)
    return series_mod.decide(ctx.host.name, ctx.read(cmd, "probe sglang patches").output, series)


def refuse_target(ctx: PlanContext, found, target: str) -> None:
    """Moving the checkout to a commit where a site patch conflicts or does nothing would leave a stack without its
    SM120 fixes (or a build without its kernel patches): stop here, before anything changes."""
    if found is None or found.error:
        return
    bad = [p for p in found.patches if p.upstream in (series_mod.CONFLICTS, series_mod.NO_EFFECT)]
    if bad:
        where = (target or found.upstream or "upstream")[:10]
        raise PlanError(ctx.host.name, name, "; ".join(
            f"{p.series} patch {p.patch} {p.upstream} on {where}" for p in bad)
            + f" ({', '.join(filter(None, (p.detail for p in bad)))}): rebase the site's patch series for that "
              "commit (`inv patches` shows each), or keep the checkout where it is; the checkout was not touched")


def pop_warnings(found) -> list[str]:
    """Local edits that are a patch upstream no longer takes: the stash pop will most likely conflict."""
    return [f"{p.patch} is in the checkout but conflicts with upstream, so the stash pop will likely fail "
            f"(the checkout is then put back)" for p in (found.patches if found else [])
            if p.checkout == series_mod.APPLIED and p.upstream == series_mod.CONFLICTS]


def plan_patches(ctx: PlanContext, series, found, updating: bool) -> list[Step | Unchanged]:
    """Apply the sglang patches the checkout lacks (uncommitted, like the local edits); upstreamed ones retire."""
    if found is None:
        return []
    if found.error:
        return [Unchanged(name, f"patch status unknown: {found.error}")]
    path = ctx.host.sglang_checkout
    missing, notes = [], []
    for st in found.patches:
        if st.status in (series_mod.APPLIED, series_mod.UPSTREAMED):
            if st.status == series_mod.UPSTREAMED:
                notes.append(f"{st.patch} is upstreamed: retire it")
            continue
        if st.checkout in (series_mod.CONFLICTS, series_mod.NO_EFFECT) and st.upstream not in (
                series_mod.WILL_APPLY, series_mod.APPLIED):
            raise PlanError(ctx.host.name, name, f"patch {st.patch} {st.status} on the checkout and on upstream: "
                                                 f"{st.detail or 'refresh it'} (see `inv patches`)")
        missing.append(st.patch)
    if not missing:
        return [Unchanged(name, "sglang patches: " + ("; ".join(notes) if notes else
                                                      f"all {len(series.patches)} applied"))]
    chosen = series_mod.Series(series.name, series.path, series.roots,
                               tuple(p for p in series.patches if p.name in missing))
    why = f"{', '.join(missing)} not in the checkout" + (" (after the update)" if updating else "")
    return [Step(name, f"apply sglang patches {', '.join(missing)}", why,
                 (series_mod.apply_command(path, chosen),), needed=series_mod.missing_command(path, chosen),
                 verify=(series_mod.applied_command(path, chosen),), timeout=300, changes=("checkout",))]


def plan(ctx: PlanContext) -> list[Step | Unchanged]:
    """Update the checkout to stack.toml's commit, then apply the sglang patches it still lacks."""
    items = plan_update(ctx)
    every = series_mod.stack_series(ctx.stack, ctx.repo)
    series = every[0]
    path = ctx.host.sglang_checkout
    if ctx.facts.checkout.present:
        pin = None if ctx.stack.sglang.commit == "latest" else ctx.stack.sglang.commit
        # one probe judges both series, on the checkout and where it is going (a pin, or upstream's tip)
        found = patch_status(ctx, every, target=pin or "")
        if isinstance(items[0], Step):  # moving: every patch must still do its job there
            refuse_target(ctx, found, pin or "")
        if found is not None:
            found = replace(found, patches=[p for p in found.patches if p.series == series.name])
        warnings = pop_warnings(found)
        if warnings and isinstance(items[0], Step):
            items[0] = replace(items[0], reason=items[0].reason + "; warning: " + "; ".join(warnings))
        return items + plan_patches(ctx, series, found, updating=isinstance(items[0], Step))
    if series.patches:  # a fresh clone has none of them; the step judges each patch itself once the clone exists
        items.append(Step(name, "apply sglang patches to the new clone", f"{len(series.patches)} patch(es) in "
                          f"{series.path.name}/series", (series_mod.apply_command(path, series),),
                          needed=series_mod.missing_command(path, series),
                          verify=(series_mod.applied_command(path, series),), timeout=300, changes=("checkout",)))
    return items


def status_cell(facts, stack) -> Cell:
    """The checkout's branch@head against the pinned commit (or the branch's tip), local edits noted."""
    co = facts.checkout
    pinned = stack.sglang.commit != "latest"
    expected = stack.sglang.commit[:12] if pinned else f"{stack.sglang.branch} (latest)"
    if co is None or not co.present:
        return Cell("absent", expected, True, "no sglang checkout")
    head = (co.head or "?")[:12]
    edits = len(co.modified) + len(co.untracked)
    note = f"{edits} local edit(s)" if edits else ""
    if pinned:
        drift = not (co.head or "").startswith(stack.sglang.commit)
    else:
        drift = bool(co.behind) or co.branch != stack.sglang.branch
        if co.behind:
            note = ", ".join(filter(None, [f"{co.behind} behind", note]))
    return Cell(f"{co.branch or 'detached'}@{head}", expected, drift, note)


declares = Declares(section="sglang", packages=(Package("sglang"),),  # installed editable from the checkout
                    columns=(Column("sglang", status_cell),))
