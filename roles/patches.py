"""Patch series (patches/<part>/series): the model, the remote judging script, and each patch's status on a host."""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet import remote
from gpufleet.engine.command import Cmd, script
from gpufleet.engine.query import Query
from gpufleet.errors import ConfigError
from gpufleet.facts.script import KERNEL_DIRS

APPLIED, WILL_APPLY, UPSTREAMED, CONFLICTS, NO_EFFECT = "applied", "will apply", "upstreamed", "conflicts", "no effect"
STATUSES = (APPLIED, WILL_APPLY, UPSTREAMED, CONFLICTS, NO_EFFECT)
# Where sgl-kernel lives in the checkout; upstream moved it in mid-2026, so the kernel patches are relative to it.
KERNEL_ROOTS = KERNEL_DIRS
MAX_SCRIPT_BYTES = 100_000  # sshd passes the command as one argument; Linux caps one argument at 128 KiB
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class FileDiff:
    """One file of a patch: its old and new path (None for /dev/null) and its hunks (old start line, header)."""

    old: str | None
    new: str | None
    hunks: tuple[tuple[int, str], ...] = ()

    @property
    def path(self) -> str:
        return self.new or self.old or ""


@dataclass(frozen=True)
class Effect:
    """What a patch is for, judged on the tree: every dict `name` in the touched directories has `key`."""

    name: str
    key: object

    def __str__(self) -> str:
        return f"{self.name} has key {self.key!r}"


@dataclass(frozen=True)
class Patch:
    """One patch file of a series."""

    name: str
    text: str
    files: tuple[FileDiff, ...]
    effect: Effect | None = None

    @property
    def probe_path(self) -> str:
        """A path the patch expects to exist (finds the root the patch is relative to)."""
        return next((f.old for f in self.files if f.old), self.files[0].path)

    def dirs(self) -> list[str]:
        return sorted({p.rpartition("/")[0] for f in self.files for p in (f.old, f.new) if p and "/" in p})


@dataclass(frozen=True)
class Series:
    """An ordered patch series; its paths are relative to the first of `roots` found in a tree."""

    name: str
    path: Path
    roots: tuple[str, ...] = ("",)
    patches: tuple[Patch, ...] = ()


def parse_diff(text: str) -> tuple[FileDiff, ...]:
    """The files and hunks of a unified git diff (leading mail text is ignored, as git apply does)."""
    files: list[FileDiff] = []
    old = new = None
    hunks: list[tuple[int, str]] = []
    header = False  # between `diff --git` and the first hunk: inside hunks `--- x` is a removed line "-- x"

    def flush():
        if old or new:
            files.append(FileDiff(old, new, tuple(hunks)))

    for line in text.splitlines():
        if line.startswith("diff --git "):
            flush()
            old = new = None
            hunks, header = [], True
        elif header and line.startswith("--- "):
            old = _diff_path(line[4:], "a/")
        elif header and line.startswith("+++ "):
            new = _diff_path(line[4:], "b/")
        elif line.startswith("@@ ") and (m := re.match(r"@@ -(\d+)", line)):
            hunks.append((int(m.group(1)), line))
            header = False
    flush()
    return tuple(files)


def _diff_path(raw: str, prefix: str) -> str | None:
    raw = raw.split("\t")[0].strip()
    return None if raw == "/dev/null" else raw.removeprefix(prefix)


def _effect(spec: str, where: str) -> Effect:
    kind, _, rest = spec.partition(":")
    name, _, key = rest.rpartition(":")
    if kind != "has-key" or not name.isidentifier() or not key:
        raise ConfigError(where, "effect must be has-key:NAME:KEY", value=spec, has_value=True)
    try:
        return Effect(name, ast.literal_eval(key))
    except (ValueError, SyntaxError):
        return Effect(name, key)


def load_series(name: str, directory: Path, roots: tuple[str, ...] = ("",)) -> Series:
    """Read directory/series; a missing directory or series file is an empty series, a bad line a ConfigError."""
    listing = Path(directory) / "series"
    if not listing.is_file():
        return Series(name, Path(directory), roots)
    patches = []
    for number, raw in enumerate(listing.read_text().splitlines(), 1):
        words = re.sub(r"(^|\s)#.*$", "", raw).split()
        if not words:
            continue
        where = f"{listing}:{number}"
        if not _NAME.match(words[0]):
            raise ConfigError(where, "a patch must be a plain file name in the series directory", value=words[0],
                              has_value=True)
        options = dict(w.partition("=")[::2] for w in words[1:])
        if set(options) - {"effect"}:
            raise ConfigError(where, "unknown option (only effect=...)", value=words[1:], has_value=True)
        file = Path(directory) / words[0]
        if not file.is_file():
            raise ConfigError(where, "patch file not found", value=str(file), has_value=True)
        text = file.read_text()
        files = parse_diff(text)
        if not files:
            raise ConfigError(str(file), "holds no diff (expected `diff --git` sections)")
        effect = _effect(options["effect"], where) if "effect" in options else None
        patches.append(Patch(words[0], text, files, effect))
    return Series(name, Path(directory), roots, tuple(patches))


def stack_series(stack, repo: Path) -> list[Series]:
    """The sglang and sgl-kernel series a stack names; relative directories are read from the repo root."""
    found = []
    for name, directory, roots in (("sglang", stack.sglang.patches, ("",)),
                                   ("sgl-kernel", stack.sgl_kernel.patches, KERNEL_ROOTS)):
        path = Path(directory) if Path(directory).is_absolute() else Path(repo) / directory
        found.append(load_series(name, path, roots))
    return found


# ---- the remote judging script -------------------------------------------------------------------------------------
_BASE = remote.text("patches_base.sh")
_LIBRARY = _BASE + remote.text("patches_judge.sh") + remote.text("host_cache.sh") + remote.text("patches_memo.sh")


def series_paths(s: Series) -> list[str]:
    """Every path the series touches or reads (effect checks read the touched directories), relative to its root."""
    found = {p for patch in s.patches for f in patch.files for p in (f.old, f.new) if p}
    found |= {d for patch in s.patches if patch.effect for d in patch.dirs()}
    return sorted(found)


def _array(name: str, items) -> str:
    return f"{name}=(" + " ".join(shlex.quote(i) for i in items) + ")"


def _write(path_expr: str, text: str) -> str:
    # printf is a bash builtin: the text never meets an exec argument limit, and shlex quoting keeps it exact
    return f"{Cmd.of('printf', '%s', text).render()} > {path_expr}"


def status_script(checkout: str, branch: str, series: list[Series], fetch: bool = True, target: str = "") -> str:
    """Bash that writes the series' patches to a temporary directory and judges each on the checkout and upstream
    (origin's branch tip, or the commit `target` names: a pin)."""
    q = shlex.quote
    lines = [f"co={q(checkout)}", f"ref={q('refs/remotes/origin/' + branch)}", _LIBRARY]
    if fetch and target:  # a pinned commit the checkout already has needs no trip to the remote
        lines.append(f"g rev-parse -q --verify {q(target + '^{commit}')} >/dev/null || gf_fetch {q(branch)}")
    elif fetch:
        lines.append(f"gf_fetch {q(branch)}")
    if target:
        lines.append(f"upref=$(g rev-parse -q --verify {q(target + '^{commit}')}) || "
                     f"{{ g fetch -q origin {q(target)} >/dev/null 2>&1; "
                     f"upref=$(g rev-parse -q --verify {q(target + '^{commit}')}); }}")
        lines.append('upstream=$upref')
    else:
        lines.append('upstream=$(g rev-parse -q --verify "$ref^{commit}")')
    lines.append('echo "@@upstream $upstream"')
    judging, watched = [], []  # the verdicts' lines, and the checkout's paths they read
    for s_index, s in enumerate(series):
        if not s.patches:
            continue
        files = {p.name: f'"$tmp/p/{s_index}-{p.name}"' for p in s.patches}
        judging.append('mkdir -p "$tmp/p"')
        judging += [_write(files[p.name], p.text) for p in s.patches]
        judging += [_array("roots", s.roots), f"probe={q(s.patches[0].probe_path)}",
                    _array("paths", series_paths(s))]
        watched += [f"{r}/{p}" if r else p for r in s.roots for p in series_paths(s)]
        for tree in ("wt", "up"):
            block = [f"gf_tree {tree} {s_index}"]
            for p in s.patches:
                block += [f"effect={q(p.effect.name if p.effect else '')}",
                          f"gf_judge {tree} {q(s.name)} {q(p.name)} {files[p.name]}"]
            judging.append("\n".join(block) if tree == "wt" else
                           '[ -z "$upstream" ] || {\n' + "\n".join(block) + "\n}")
    lines += _remembered(judging, watched)
    text = "\n".join(lines) + "\nexit 0\n"
    if len(text.encode()) > MAX_SCRIPT_BYTES:
        raise ConfigError(str(series[0].path if series else "patches"),
                          f"the patch series are too large to send in one command ({len(text)} bytes)")
    return text


def _remembered(judging: list[str], watched: list[str]) -> list[str]:
    """The judging lines, answered from the host's memo when nothing they read has changed (patches_memo.sh)."""
    if not judging:
        return []
    body = "\n".join(judging)
    digest = hashlib.sha256((_LIBRARY + body).encode()).hexdigest()
    return [_array("watched", sorted(set(watched))),
            f"key=$(gf_memo_key {digest}) || key=",
            'if [ -n "$key" ] && [ -f "$gf_memo_dir/$key" ]; then gf_memo_print "$key"; exit 0; fi',
            "gf_tmp",
            "{\n" + body + '\n} > "$tmp/judged"',
            'cat -- "$tmp/judged"',
            '[ -z "$key" ] || gf_memo_keep "$key"']


def status_command(checkout: str, branch: str, series: list[Series], fetch: bool = True, target: str = "") -> Cmd:
    """The one read-only remote command judging every patch (fetching origin's branch first unless fetch=False)."""
    return script(status_script(checkout, branch, series, fetch, target))


def status_query(checkout: str, branch: str, series: list[Series], fetch: bool = True, target: str = "",
                 step: str = "patches") -> "Query[HostPatches]":
    """status_command, its output decided into each patch's status on the host."""
    return Query(status_command(checkout, branch, series, fetch, target),
                 lambda host, output: decide(host, output, series), step, timeout=900)


# ---- parsing and deciding ------------------------------------------------------------------------------------------
@dataclass
class Judgement:
    """What git apply said about one patch on one tree (wt: the checkout as it is, up: upstream's branch)."""

    tree: str
    series: str
    patch: str
    fwd: bool
    rev: bool
    root: str
    errors: list[str] = field(default_factory=list)
    pre: dict[str, str] = field(default_factory=dict)
    post: dict[str, str] | None = None


@dataclass
class PatchStatus:
    """One patch on one host: the status people read, why, and the verdict on each tree."""

    series: str
    patch: str
    status: str
    detail: str = ""
    checkout: str = ""
    upstream: str | None = None

    def to_json(self) -> dict:
        return {"series": self.series, "patch": self.patch, "status": self.status, "detail": self.detail,
                "checkout": self.checkout, "upstream": self.upstream}


@dataclass
class HostPatches:
    """Every patch's status on one host, and what upstream they were judged against."""

    host: str
    head: str | None = None
    upstream: str | None = None
    fetch_error: str | None = None
    patches: list[PatchStatus] = field(default_factory=list)
    error: str | None = None
    remembered: bool = False  # the verdicts came from the host's memo: nothing they read had changed

    def to_json(self) -> dict:
        return {"host": self.host, "reachable": True, "error": self.error, "head": self.head,
                "upstream": self.upstream, "fetch_error": self.fetch_error, "remembered": self.remembered,
                "patches": [p.to_json() for p in self.patches]}

    def status(self, series: str, patch: str) -> PatchStatus | None:
        return next((p for p in self.patches if (p.series, p.patch) == (series, patch)), None)


def parse_output(host: str, text: str) -> tuple[HostPatches, list[Judgement]]:
    """Split the judging script's output into host-level facts and one Judgement per patch and tree."""
    found = HostPatches(host)
    judgements: list[Judgement] = []
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("@@judge "):
            tree, series, patch, fwd, rev, root = (line.split(" ", 6)[1:] + [""] * 6)[:6]
            judgements.append(Judgement(tree, series, patch, fwd == "fwd=0", rev == "rev=0",
                                        root.removeprefix("root=")))
        elif line.startswith("|") and judgements:
            judgements[-1].errors.append(line[1:])
        elif line.startswith("@@file ") and judgements:
            _, when, path = line.split(" ", 2)
            content = base64.b64decode(next(lines, "")).decode("utf-8", "replace")
            j = judgements[-1]
            if when == "post":
                j.post = {**(j.post or {}), path: content}
            else:
                j.pre[path] = content
        elif line.startswith("@@head "):
            found.head = line[7:].strip() or None
        elif line.startswith("@@upstream "):
            found.upstream = line[11:].strip() or None
        elif line.startswith("@@fetch ") and not line.startswith("@@fetch rc=0"):
            found.fetch_error = line.split(" ", 2)[-1].strip() or "git fetch failed"
        elif line.startswith("@@error "):
            found.error = line[8:].strip()
        elif line.startswith("@@memo "):
            found.remembered = True
    return found, judgements


@functools.lru_cache(maxsize=256)
def dict_keys_defined(text: str, name: str) -> tuple[tuple[int, frozenset], ...]:
    """(line, constant keys) of each dict assigned to `name` in Python source; none when it does not parse.
    Remembered: every host of a fleet sends the same files (a survey of 8 hosts parsed the same few texts 48 times,
    ~0.3 ms of the control node's CPU each)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ()  # conflict markers and the like: that file proves nothing either way
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(node.value, ast.Dict):
            found.append((node.lineno, frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant))))
    return tuple(found)


def effect_holds(effect: Effect, files: dict[str, str]) -> tuple[bool, str]:
    """Whether every dict `effect.name` defined in files has the key, and if not, where it is missing."""
    defs = [(path, line, effect.key in keys) for path, text in sorted(files.items())
            for line, keys in dict_keys_defined(text, effect.name)]
    if not defs:
        return False, f"no dict {effect.name} found"
    missing = [f"{p}:{n}" for p, n, ok in defs if not ok]
    if missing:
        return False, f"{effect.name} at {', '.join(missing)} has no key {effect.key!r}"
    return True, ""


def failed_hunks(patch: Patch, j: Judgement) -> str:
    """Which hunks git apply rejected, from its `patch failed: FILE:LINE` lines, named by the patch's hunk header."""
    notes = []
    for line in j.errors:
        root = f"{j.root}/" if j.root else ""
        if m := re.search(r"patch failed: (.+):(\d+)$", line):
            path, start = m.group(1).removeprefix(root), int(m.group(2))
            header = next((h for f in patch.files if f.path == path or f.old == path for s, h in f.hunks
                           if s == start), "")
            notes.append(f"{path}:{start}" + (f" (hunk {header})" if header else ""))
        elif m := re.search(r"error: (.+): (No such file or directory|does not exist in index)$", line):
            notes.append(f"{m.group(1).removeprefix(root)}: missing")
        elif m := re.search(r"error: (.+): already exists in working directory$", line):
            notes.append(f"{m.group(1).removeprefix(root)}: already exists")
    if not notes and j.errors:
        notes.append(j.errors[-1].strip())
    return "; ".join(dict.fromkeys(notes)) or "git apply --check failed"


def tree_verdict(patch: Patch, j: Judgement) -> tuple[str, str]:
    """applied / will apply / conflicts / no effect for one tree: git apply's answer, checked against the effect."""
    has_now, why = effect_holds(patch.effect, j.pre) if patch.effect else (None, "")
    if j.rev:
        return (NO_EFFECT, f"patch is in, but {why}") if has_now is False else (APPLIED, "")
    if has_now:
        return APPLIED, f"{patch.effect} already (the tree differs from the patch text)"
    if j.fwd:
        if patch.effect and j.post is not None:
            after, why = effect_holds(patch.effect, j.post)
            if not after:
                return NO_EFFECT, f"applies, but afterwards {why}: upstream moved the table?"
        return WILL_APPLY, ""
    return CONFLICTS, failed_hunks(patch, j)


def decide(host: str, text: str, series: list[Series]) -> HostPatches:
    """Each patch's status on the host; upstreamed wins when upstream's tree already has the patch (or its effect)."""
    found, judgements = parse_output(host, text)
    if found.error:
        return found
    by_key = {(j.tree, j.series, j.patch): j for j in judgements}
    for s in series:
        for patch in s.patches:
            wt, up = by_key.get(("wt", s.name, patch.name)), by_key.get(("up", s.name, patch.name))
            if wt is None:
                found.patches.append(PatchStatus(s.name, patch.name, CONFLICTS, "not judged (script output cut?)"))
                continue
            here, detail = tree_verdict(patch, wt)
            there, there_detail = tree_verdict(patch, up) if up else (None, "")
            if there == APPLIED:
                note = f"upstream {found.upstream[:10] if found.upstream else ''} has it: retire the patch"
                found.patches.append(PatchStatus(s.name, patch.name, UPSTREAMED,
                                                 "; ".join(filter(None, [note, there_detail])), here, there))
            else:
                if there in (CONFLICTS, NO_EFFECT):  # say so now: the next pull will meet it
                    detail = "; ".join(filter(None, [detail, f"on upstream {(found.upstream or '')[:10]}: {there}"
                                                             + (f" ({there_detail})" if there_detail else "")]))
                found.patches.append(PatchStatus(s.name, patch.name, here, detail, here, there))
    return found


# ---- applying a series to the checkout (for roles) -----------------------------------------------------------------
def _series_blocks(series: list[Series], per_patch) -> list[str]:
    """Write each patch to the temporary directory, find its series' root in the checkout, then run per_patch."""
    q = shlex.quote
    lines = ["gf_tmp", 'mkdir -p "$tmp/p"']
    for s_index, s in enumerate(series):
        if not s.patches:
            continue
        lines += [_array("roots", s.roots), f"probe={q(s.patches[0].probe_path)}", "gf_root wt"]
        for patch in s.patches:
            file = f'"$tmp/p/{s_index}-{patch.name}"'
            lines += [_write(file, patch.text), per_patch(q(patch.name), file)]
    return lines


def _checkout_script(checkout: str, series: list[Series] | Series, per_patch, *, prelude: str = "",
                     tail: str = "exit 0") -> Cmd:
    series = [series] if isinstance(series, Series) else series
    text = "\n".join([f"co={shlex.quote(checkout)}", "nock=3", _BASE, prelude, *_series_blocks(series, per_patch),
                      tail])
    return script(text + "\n")


_UNDO = remote.text("patches_undo.sh")


def _apply_one(name: str, file: str) -> str:
    return "\n".join([
        f'if gf_apply "$co" --reverse --check {file} 2>/dev/null; then echo "gpufleet: "{name}" already applied"',
        f'elif gf_apply "$co" --check {file} 2>"$tmp/err"; then',
        f'    gf_apply "$co" {file} || {{ gf_undo; exit 2; }}',
        f'    done_+=("${{dirarg[*]-}}|"{file}); echo "gpufleet: applied "{name}',
        "else",
        '    why=$(grep -E "^error" "$tmp/err" | head -n 4 | tr "\\n" " ")',
        f'    echo "gpufleet: patch "{name}" does not apply: $why"',
        "    gf_undo; exit 2",
        "fi"])


def apply_command(checkout: str, series: list[Series] | Series) -> Cmd:
    """Apply each patch the checkout lacks, in order, as uncommitted edits; on a conflict undo this run's and exit 2."""
    return _checkout_script(checkout, series, _apply_one, prelude=_UNDO).owned_by(checkout)


def missing_command(checkout: str, series: list[Series] | Series) -> Cmd:
    """Exit 0 while some patch is not in the checkout (the apply step is still needed), 1 when all are."""
    return _checkout_script(checkout, series,
                            lambda n, f: f'gf_apply "$co" --reverse --check {f} 2>/dev/null || exit 0', tail="exit 1")


def applied_command(checkout: str, series: list[Series] | Series) -> Cmd:
    """Exit 0 when every patch is in the checkout (git apply --reverse --check), else name the first missing one."""
    return _checkout_script(checkout, series, lambda n, f: f'gf_apply "$co" --reverse --check {f} 2>/dev/null '
                                                           f'|| {{ echo "gpufleet: "{n}" is not applied"; exit 1; }}')
