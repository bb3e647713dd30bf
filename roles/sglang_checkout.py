"""Role: keep the sglang source checkout on upstream's branch (stash, fast-forward, pop; put back on failure)."""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import replace
from urllib.parse import urlsplit

from gpufleet import remote
from gpufleet.engine import query
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

_PRELUDE = remote.text("checkout_prelude.sh")
_UPDATE = remote.text("checkout_update.sh")


def _vars(**values: str) -> str:
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items())


def update_script(checkout: str, branch: str, target: str = "", pinned: bool = False,
                  backups: str | None = None) -> str:
    """Bash for the stash / fast-forward / pop flow; target "" means origin's branch tip at run time."""
    backups = backups or BACKUPS
    head = _vars(co=checkout, branch=branch, target=target, pinned="1" if pinned else "0", backups=backups,
                 marker_name=MARKER, exit_restored=str(EXIT_RESTORED), exit_refused=str(EXIT_REFUSED),
                 exit_not_restored=str(EXIT_NOT_RESTORED))
    return head + "\n" + _PRELUDE + _UPDATE


def update_command(checkout: str, branch: str, target: str = "", pinned: bool = False) -> Cmd:
    return script(update_script(checkout, branch, target, pinned)).owned_by(checkout)


def probe_command(checkout: str, branch: str) -> Cmd:
    """Read-only: the sha of origin's branch (ls-remote) and whether HEAD already contains it."""
    return script(_vars(co=checkout, branch=branch) + "\n" + _PRELUDE + remote.text("checkout_probe.sh"))


def done_command(checkout: str, target: str, pinned: bool) -> Cmd:
    """Exit 0 when the checkout is at target (pinned) or contains it (latest), with no update left half-done."""
    return script(_vars(co=checkout, target=target, pinned="1" if pinned else "0", marker_name=MARKER) + "\n"
                  + _PRELUDE + remote.text("checkout_done.sh"))


def needed_command(checkout: str, target: str, pinned: bool) -> Cmd:
    """Exit 0 while the update is still needed, 1 once the checkout is at its target."""
    done = done_command(checkout, target, pinned)
    return script(f"if {done.render()}; then exit 1; fi; exit 0")


def clone_command(checkout: str, remote: str, branch: str, pin: str | None) -> Cmd:
    parts = [f"mkdir -p {shlex.quote(posixpath.dirname(checkout))}",
             Cmd.of("git", "clone", "-q", "--branch", branch, "--", remote, checkout).render()]
    if pin:
        parts.append(Cmd.of("git", "-C", checkout, "reset", "-q", "--hard", pin).render())
    return script(" && ".join(parts)).owned_by(checkout)  # a new clone belongs to its directory's owner


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
    return _plan_update(ctx)[0]


def _plan_update(ctx: PlanContext) -> tuple[list[Step | Unchanged], str]:
    """plan_update's items, and the commit the checkout is to be at: the pin, or upstream's tip as the probe read it
    ("" when nothing was read)."""
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
                     changes=("checkout",))], pin or ""
    if co.branch != want.branch:
        raise PlanError(host.name, name, f"{path} is on {co.branch or 'a detached HEAD'}, stack.toml wants branch "
                                         f"{want.branch}: switch it yourself")
    if co.remote_url and normalise_remote(co.remote_url) != normalise_remote(want.remote):
        raise PlanError(host.name, name, f"origin of {path} is {co.remote_url}, stack.toml wants "
                                         f"{redact_url(want.remote)}: change one of them (git remote set-url origin)")
    head = co.head or ""
    if pin:
        if head.startswith(pin):
            return [Unchanged(name, f"{want.branch}@{head[:10]} is the pinned commit")], pin
        target, contained = pin, False
    else:
        target, contained = _target(ctx, path, want.branch)
        if target and head == target:
            return [Unchanged(name, f"{want.branch}@{head[:10]} is upstream's tip")], target
        if contained:
            return [Unchanged(name, f"{want.branch}@{head[:10]} already contains upstream's tip {target[:10]} "
                                    f"(local commits on top)")], target
    shown = target[:10] if target else f"origin/{want.branch}"
    reason = f"checkout at {head[:10]}, {'stack.toml pins' if pin else 'upstream is at'} {shown}; {_edits(co)}"
    verify = (done_command(path, target, bool(pin)),) if target else ()
    return [Step(name, f"update sglang checkout {head[:10]} -> {shown}", reason,
                 (update_command(path, want.branch, target, bool(pin)),),
                 needed=needed_command(path, target, bool(pin)) if target else None,
                 verify=verify, timeout=UPDATE_TIMEOUT, changes=("checkout",))], target


def patch_status(ctx: PlanContext, series, target: str = "") -> "series_mod.HostPatches | None":
    """Each patch judged on the checkout and on upstream's branch, or on `target` (a pinned commit): one read-only
    probe; None without a probe."""
    series = [series] if isinstance(series, series_mod.Series) else [s for s in series if s.patches]
    if not any(s.patches for s in series) or ctx.read is None:
        return None
    return query.read(ctx, series_mod.status_query(ctx.host.sglang_checkout, ctx.stack.sglang.branch, series,
                                                   target=target, step="probe sglang patches"))


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
    items, target = _plan_update(ctx)
    every = series_mod.stack_series(ctx.stack, ctx.repo)
    series = every[0]
    path = ctx.host.sglang_checkout
    if ctx.facts.checkout.present:
        pin = None if ctx.stack.sglang.commit == "latest" else ctx.stack.sglang.commit
        # one probe judges both series, on the checkout and where it is going (a pin, or upstream's tip as the
        # upstream probe just read it: a checkout that already has that commit is judged with no fetch)
        found = patch_status(ctx, every, target=target)
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
