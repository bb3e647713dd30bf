"""model-server role: the SGLang systemd unit from stack.toml, its secrets file, a restart only when something changed."""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from gpufleet import remote
from gpufleet.facts import modelfiles
from gpufleet.kernel.buildcache import installed_record
from gpufleet.engine import query
from gpufleet.engine.command import Cmd, Secret
from gpufleet.engine.query import Query
from gpufleet.facts.script import unit_name
from gpufleet.plan import PlanContext, PlanError, Step, Unchanged
from gpufleet.cachedir import cache_root, keep_memo

name = "model-server"
UNIT_DIR = "/etc/systemd/system"
ENV_DIR = "/etc/gpufleet"
RECORD_DIR = "/var/lib/gpufleet/model-server"
# Constant, not health_timeout: tuning the health gate must not rewrite the unit (and restart a 397B server).
TIMEOUT_START = 7200
DOWNLOAD_TIMEOUT = 24 * 3600.0
# Changes earlier roles make (Step.changes) that the running server must be restarted to pick up.
STACK_CHANGES = frozenset({"venv", "checkout", "kernel"})


_TEMPLATE_LOCK = threading.Lock()


TEMPLATES = Path(__file__).parent / "templates"
UNIT_TEMPLATE = "sglang.service.j2"
# how the template's whitespace is read: part of what decides the rendered text, so part of the memo's key
_TEMPLATE_OPTIONS = {"trim_blocks": True, "lstrip_blocks": True, "keep_trailing_newline": True, "autoescape": False}


@functools.cache
def _templates():
    """The unit's template environment, made when a unit is first rendered (jinja2 costs ~30 ms to import, which an
    `inv status` that renders nothing need not pay)."""
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                              **_TEMPLATE_OPTIONS)


def unit_template():
    """The unit's compiled template."""
    # one at a time: hosts planned side by side would each make an environment and compile the template (~1 ms of
    # the control node's CPU a host); the first makes them, the others find them in the caches
    with _TEMPLATE_LOCK:
        return _templates().get_template(UNIT_TEMPLATE)


_SAFE_WORD = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
# systemd refuses an ExecStart executable whose path holds a quote or a backslash ("Executable name contains special
# characters"); such a venv's python is started by sh with its path as $0, never pasted into a script.
_SD_UNSAFE_EXEC = re.compile(r"[\"'\\]")
_EXEC_VIA_SH = ("/bin/sh", "-c", 'exec "$0" "$@"')


def unit_path(host) -> str:
    return f"{UNIT_DIR}/{unit_name(host.service)}"


def env_path(host) -> str:
    return f"{ENV_DIR}/{host.service}.env"


def record_path(host) -> str:
    """Where the restart step records the stack the server was started on."""
    return f"{RECORD_DIR}/{host.service}.json"


def sd_quote(word: str, *, expand: bool = True) -> str:
    """One word for a systemd unit line: specifiers (%) and, in ExecStart (expand), $VAR kept literal."""
    text = word.replace("%", "%%")
    if expand:
        text = text.replace("$", "$$")
    if _SAFE_WORD.fullmatch(word):
        return text
    for raw, esc in (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\t", "\\t")):
        text = text.replace(raw, esc)
    return f'"{text}"'


def served_name(host, stack) -> str:
    """The model name clients use: stack.model.served_name, else the model path (sglang's own default)."""
    return stack.model.served_name or host.model_path


def exec_groups(host, stack) -> list[tuple[str, ...]]:
    """The server's argv, one group per flag (a line of the unit each)."""
    s = stack.server
    groups: list[tuple[str, ...]] = [
        (f"{host.venv}/bin/python", "-m", "sglang.launch_server"),
        ("--model-path", host.model_path),
        ("--served-model-name", served_name(host, stack)),
        ("--tp", str(s.tp)), ("--host", s.host), ("--port", str(s.port)),
        ("--quantization", s.quantization), ("--attention-backend", s.attention_backend),
        ("--moe-runner-backend", s.moe_runner_backend), ("--fp4-gemm-backend", s.fp4_gemm_backend),
        ("--kv-cache-dtype", s.kv_cache_dtype), ("--mem-fraction-static", str(s.mem_fraction_static)),
    ]
    if s.context_length is not None:
        groups.append(("--context-length", str(s.context_length)))
    if s.disable_custom_all_reduce:
        groups.append(("--disable-custom-all-reduce",))
    spec = s.speculative
    if spec.algorithm:
        groups += [("--speculative-algorithm", spec.algorithm), ("--speculative-num-steps", str(spec.num_steps)),
                   ("--speculative-eagle-topk", str(spec.eagle_topk)),
                   ("--speculative-num-draft-tokens", str(spec.num_draft_tokens))]
        if spec.draft_model_path:
            groups.append(("--speculative-draft-model-path", spec.draft_model_path))
    if s.reasoning_parser:
        groups.append(("--reasoning-parser", s.reasoning_parser))
    if s.tool_call_parser:
        groups.append(("--tool-call-parser", s.tool_call_parser))
    if s.extra_args:
        groups.append(tuple(s.extra_args))
    return groups


def exec_args(host, stack) -> list[str]:
    """The exact argv systemd starts."""
    return [word for group in exec_groups(host, stack) for word in group]


def python_minor(python_version: str | None, host_name: str) -> str:
    m = re.match(r"(\d+\.\d+)", python_version or "")
    if not m:
        raise PlanError(host_name, name, "the venv's Python version is unknown (needed for the site-packages "
                                         "path in LD_LIBRARY_PATH); is the venv there?")
    return m.group(1)


def environment(host, stack, python_version: str) -> dict[str, str]:
    """The server's environment: CUDA for flashinfer's JIT, the venv's CUDA libraries, then stack.server.env."""
    cuda = stack.sgl_kernel.cuda_home
    site = f"{host.venv}/lib/python{python_version}/site-packages"
    env = {"CUDA_HOME": cuda, "PATH": f"{host.venv}/bin:{cuda}/bin:/usr/bin:/bin",
           "LD_LIBRARY_PATH": f"{site}/nvidia/cu13/lib:{cuda}/lib64"}
    env.update(sorted(stack.server.env.items()))
    return env


def _unit_values(host, stack, python_version: str) -> dict:
    """What the unit's template is rendered with."""
    env = environment(host, stack, python_version)
    return dict(model=stack.model.name, service=host.service, env_file=env_path(host), timeout_start=TIMEOUT_START,
                environment=[sd_quote(f"{k}={v}", expand=False) for k, v in env.items()],
                exec_lines=[" ".join(sd_quote(w) for w in group) for group in _exec_start(exec_groups(host, stack))])


def render_unit(host, stack, python_version: str) -> str:
    """The unit file's text (python_version: the venv's, e.g. "3.12")."""
    return unit_template().render(**_unit_values(host, stack, python_version))


def unit_sha256(host, stack, python_version: str) -> str:
    """The sha256 of render_unit's text, remembered on the control node under what decides it (the template's
    bytes, its options, the jinja2 installed, the values rendered): `inv status` compares every host's unit with it
    and, once it has seen these values, neither imports jinja2 nor renders."""
    values = _unit_values(host, stack, python_version)
    key = hashlib.sha256(json.dumps({**_renderer(TEMPLATES), "values": values}, sort_keys=True).encode()).hexdigest()
    memo = _unit_memo_dir() / key
    try:
        known = memo.read_text()
    except (OSError, UnicodeDecodeError):
        known = ""
    if re.fullmatch(r"[0-9a-f]{64}", known):
        return known
    digest = sha256(unit_template().render(**values))
    keep_memo(memo, digest)  # a control node whose cache cannot be written renders every time
    return digest


@functools.cache
def _renderer(templates: Path) -> dict:
    """What besides the values decides the rendered unit: the template's text, its options, the jinja2 installed;
    read once a process (a status asks for every host)."""
    return {"template": (templates / UNIT_TEMPLATE).read_bytes().decode(), "options": _TEMPLATE_OPTIONS,
            "jinja2": _jinja2_stamp()}


def _unit_memo_dir() -> Path:
    return cache_root() / "units"


def _jinja2_stamp() -> list:
    """Which jinja2 would render (its package's path, size and change time), found without importing it: another
    jinja2 installed could render the same template otherwise."""
    import importlib.util

    spec = importlib.util.find_spec("jinja2")
    if spec is None or not spec.origin:
        return []
    info = os.stat(spec.origin)
    return [spec.origin, info.st_size, info.st_mtime_ns]


def _exec_start(groups: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """ExecStart's words: the server's argv, behind sh's exec when systemd would refuse the executable's path."""
    first, *rest = groups
    if _SD_UNSAFE_EXEC.search(first[0]):
        return [_EXEC_VIA_SH + first, *rest]
    return groups


def env_file_text(secrets: Mapping[str, str]) -> str:
    """An EnvironmentFile: one KEY='value' line per secret (single quotes: no escapes, no expansion)."""
    lines = []
    for key, value in sorted(secrets.items()):
        if "'" in value or "\n" in value or "\\" in value:
            raise ValueError(f"secret {key} contains a quote, backslash or newline")
        lines.append(f"{key}='{value}'")
    return "# Managed by gpufleet: secrets of the model server (mode 0600).\n" + "\n".join(lines) + "\n"


def unit_diff(current: str | None, rendered: str, path: str) -> str:
    """A unified diff from the unit on the host (None: absent) to the rendered one; empty when equal."""
    old = [] if current is None else current.splitlines(keepends=True)
    new = rendered.splitlines(keepends=True)
    lines = difflib.unified_diff(old, new, fromfile=f"{path} (on host)" if current is not None else "/dev/null",
                                 tofile=f"{path} (rendered)")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def stack_record(ctx: PlanContext, kernel_record_sha: str | None) -> dict:
    """What the server runs on: venv packages, the checkout's HEAD and local edits, the installed kernel build."""
    facts = ctx.facts
    checkout = facts.checkout
    return {"python": facts.python_version, "packages": dict(sorted((facts.packages or {}).items())),
            "checkout": {"head": checkout.head if checkout else None,
                         "modified": sorted(checkout.modified) if checkout else []},
            "kernel_build": kernel_record_sha}


def record_changes(old: dict | None, new: dict) -> list[str]:
    """What differs between the stack the server was started on and the stack now, in short phrases."""
    if old is None:
        return ["no record of the stack the running server was started on"]
    found = []
    old_pk, new_pk = old.get("packages") or {}, new.get("packages") or {}
    for pkg in sorted(set(old_pk) | set(new_pk)):
        if old_pk.get(pkg) != new_pk.get(pkg):
            found.append(f"{pkg} {old_pk.get(pkg, 'absent')} -> {new_pk.get(pkg, 'absent')}")
    if old.get("python") != new.get("python"):
        found.append(f"python {old.get('python')} -> {new.get('python')}")
    oc, nc = old.get("checkout") or {}, new.get("checkout") or {}
    if oc.get("head") != nc.get("head"):
        found.append(f"sglang checkout {str(oc.get('head'))[:10]} -> {str(nc.get('head'))[:10]}")
    if oc.get("modified") != nc.get("modified"):
        found.append("local edits of the checkout changed")
    if old.get("kernel_build") != new.get("kernel_build"):
        found.append("installed sgl-kernel build changed")
    return found


def stack_changed(items: Iterable) -> bool:
    """True when applied steps of earlier roles (executor entries or Steps) touched what the server runs on."""
    for item in items:
        step = getattr(item, "item", item)
        status = getattr(item, "status", "changed")
        if isinstance(step, Step) and status == "changed" and STACK_CHANGES & set(step.changes):
            return True
    return False


@dataclass(frozen=True)
class HostState:
    """What the plan-time probe read: the unit on the host, the env file's hash and mode, the stack record."""

    unit: str | None = None
    env_sha: str | None = None
    env_mode: str | None = None
    record: dict | None = None
    kernel_sha: str | None = None
    need_reload: bool = False


_STATE_PROBE = remote.text("server_state.sh")


def state_query(host) -> Query[HostState]:
    """The state probe for an inventory host; an unreadable answer is a PlanError quoting its last lines."""
    def parse(host_name: str, output: str) -> HostState:
        try:
            return parse_state(output)
        except ValueError as exc:
            tail = "\n".join(output.rstrip("\n").splitlines()[-5:])
            raise PlanError(host_name, name, f"could not read the unit's state: {exc}: {tail}") from None
    cmd = Cmd.of("bash", "-c", _STATE_PROBE, "state", unit_path(host), env_path(host), record_path(host),
                 installed_record(host.venv), unit_name(host.service))
    return Query(cmd, parse, "model-server state")


def parse_state(text: str) -> HostState:
    """Parse the state probe: key=value lines, then `@@unit present|absent` and the unit's text to the end."""
    head, sep, unit_text = text.partition("@@unit ")
    if not sep:
        raise ValueError("no @@unit marker in the probe's output")
    values = dict(line.split("=", 1) for line in head.splitlines() if re.match(r"^[a-z_]+=", line))
    kind, _, body = unit_text.partition("\n")
    try:
        record = json.loads(values["record"]) if values.get("record") else None
    except ValueError:
        record = None  # unreadable: treated like no record (restart)
    return HostState(unit=body if kind.strip() == "present" else None, env_sha=values.get("env_sha") or None,
                     env_mode=values.get("env_mode") or None, record=record,
                     kernel_sha=values.get("kernel_sha") or None, need_reload=values.get("need_reload") == "yes")


def _write_cmd(path: str, content: str | Secret, mode: str) -> Cmd:
    """Write a file atomically (temp file, chmod, rename) with its content as an argument (a Secret stays masked)."""
    body = ('set -e; umask 077; mkdir -p -- "$(dirname -- "$1")"; printf "%s" "$2" > "$1.gpufleet-tmp"; '
            'chmod "$3" -- "$1.gpufleet-tmp"; mv -f -- "$1.gpufleet-tmp" "$1"')
    return Cmd.of("bash", "-c", body, "write", path, content, mode)


def _differs_cmd(path: str, digest: str, mode: str) -> Cmd:
    """exit 0 while the file's sha256 or mode differs from the wanted ones, 1 once both match."""
    body = ('[ -f "$1" ] && [ "$(sha256sum < "$1" | cut -d " " -f 1)" = "$2" ] && '
            '[ "$(stat -c %a -- "$1")" = "$3" ] && exit 1; exit 0')
    return Cmd.of("bash", "-c", body, "differs", path, digest, mode)


def _matches_cmd(path: str, digest: str, mode: str) -> Cmd:
    body = ('[ "$(sha256sum < "$1" | cut -d " " -f 1)" = "$2" ] && [ "$(stat -c %a -- "$1")" = "$3" ] || '
            '{ echo "$1 does not hold what was written"; exit 1; }; echo "$1 ok"')
    return Cmd.of("bash", "-c", body, "check", path, digest, mode)


def restart_reasons(*, unit_changed: bool, env_changed: bool, need_reload: bool, stack_changes: list[str],
                    active: str, restart_needed: bool) -> list[str]:
    """Why the server must be (re)started; empty when it may keep running (the handler is not notified)."""
    reasons = []
    if unit_changed:
        reasons.append("the unit changed")
    if env_changed:
        reasons.append("its environment file changed")
    if need_reload and not unit_changed:
        reasons.append("systemd holds an older version of the unit (NeedDaemonReload)")
    if restart_needed:
        reasons.append("earlier steps of this run changed the stack under it")
    if stack_changes and not unit_changed:
        reasons.append("the stack under it changed: " + "; ".join(stack_changes[:6])
                       + (f" (+{len(stack_changes) - 6} more)" if len(stack_changes) > 6 else ""))
    if active not in ("active", "activating", "reloading") and not reasons:
        reasons.append(f"the service is {active}")
    return reasons


@dataclass
class ModelServer:
    """The role, configured for one run: secrets for the env file, --download, the "stack changed" signal."""

    secrets: Mapping[str, str] = field(default_factory=dict)
    download: bool = False
    restart_needed: bool = False
    name: str = name

    def plan(self, ctx: PlanContext) -> list[Step | Unchanged]:
        """Model files, then unit, env file, enable, and one restart at the end if anything notified it."""
        if ctx.read is None:
            raise PlanError(ctx.host.name, name, "needs a remote probe to read the unit and the model files")
        host, unit = ctx.host, unit_name(ctx.host.service)
        items: list[Step | Unchanged] = [self._model_files(ctx)]
        if ctx.facts.unit is not None and not ctx.facts.unit.systemd:
            raise PlanError(host.name, name, "systemd is not running on the host (the server runs as a systemd unit)")
        state = query.read(ctx, state_query(host))
        version = python_minor(ctx.facts.python_version, host.name)
        # the host's unit against the remembered sha256 first: a converged host's plan renders nothing (no jinja2)
        unit_changed = state.unit is None or sha256(state.unit) != unit_sha256(host, ctx.stack, version)
        if unit_changed:
            items.append(self._unit_step(ctx, state, render_unit(host, ctx.stack, version)))
        else:
            items.append(Unchanged(name, f"{unit_path(host)} is up to date"))
        env_changed = False
        if self.secrets:
            text = env_file_text(self.secrets)
            env_changed = state.env_sha != sha256(text) or state.env_mode != "600"
            if env_changed:
                items.append(self._env_step(ctx, state, text))
            else:
                items.append(Unchanged(name, f"{env_path(host)} holds the given secrets (mode 0600)"))
        enabled = ctx.facts.unit.enabled if ctx.facts.unit else "unknown"
        if enabled != "enabled":
            items.append(Step(role=name, title=f"enable {unit} at boot", reason=f"systemctl is-enabled says {enabled}",
                              commands=(Cmd.of("systemctl", "enable", "--", unit),),
                              needed=Cmd.of("bash", "-c", '! systemctl is-enabled --quiet -- "$1"', "needed", unit),
                              verify=(Cmd.of("systemctl", "is-enabled", "--", unit),), changes=("unit",)))
        record = stack_record(ctx, state.kernel_sha)
        active = ctx.facts.unit.active if ctx.facts.unit else "unknown"
        reasons = restart_reasons(unit_changed=unit_changed, env_changed=env_changed, need_reload=state.need_reload,
                                  stack_changes=record_changes(state.record, record) if active == "active" else [],
                                  active=active, restart_needed=self.restart_needed)
        if reasons:
            items.append(self._restart_step(ctx, reasons, record, started=active == "active"))
        else:
            items.append(Unchanged(name, f"{unit} is {active} on the stack it was started on: no restart"))
        return items

    def _model_files(self, ctx: PlanContext) -> Step | Unchanged:
        host = ctx.host
        python = f"{host.venv}/bin/python"
        report = query.read(ctx, modelfiles.model_query(host.model_path, python))
        if report.ok:
            return Unchanged(name, f"model files complete in {host.model_path}: {report.summary()}")
        if not self.download:
            raise PlanError(host.name, name, f"model files in {host.model_path} are incomplete: "
                                             f"{'; '.join(report.problems())}. Copy them there, or run with "
                                             f"--download to fetch {ctx.stack.model.name} on the host")
        env = {k: Secret(v) for k, v in self.secrets.items() if k == "HF_TOKEN"}
        return Step(role=name, title=f"download {ctx.stack.model.name} to {host.model_path}",
                    reason=f"model files incomplete: {'; '.join(report.problems())}",
                    commands=(modelfiles.download_cmd(ctx.stack.model.name, host.model_path, host.venv, env),),
                    needed=modelfiles.check_cmd(host.model_path, python, mode="needed"),
                    verify=(modelfiles.check_cmd(host.model_path, python, mode="verify"),),
                    timeout=DOWNLOAD_TIMEOUT, changes=("model",))

    def _unit_step(self, ctx: PlanContext, state: HostState, rendered: str) -> Step:
        path = unit_path(ctx.host)
        what = "install" if state.unit is None else "update"
        return Step(role=name, title=f"{what} {path}",
                    reason=(f"{path} is absent" if state.unit is None else f"{path} differs from the rendered unit")
                    + ":\n" + unit_diff(state.unit, rendered, path).rstrip("\n"),
                    commands=(_write_cmd(path, rendered, "644"),),
                    needed=_differs_cmd(path, sha256(rendered), "644"),
                    verify=(_matches_cmd(path, sha256(rendered), "644"),), changes=("unit",))

    def _env_step(self, ctx: PlanContext, state: HostState, text: str) -> Step:
        path = env_path(ctx.host)
        if state.env_sha is None:
            why = f"{path} is absent"
        elif state.env_sha != sha256(text):
            why = f"{path} holds other values"
        else:
            why = f"{path} has mode {state.env_mode}, not 600"
        keys = ", ".join(sorted(self.secrets))
        return Step(role=name, title=f"write {path} ({keys}, mode 0600)", reason=why,
                    commands=(_write_cmd(path, Secret(text), "600"),),
                    needed=_differs_cmd(path, sha256(text), "600"),
                    verify=(_matches_cmd(path, sha256(text), "600"),), changes=("unit",))

    def _restart_step(self, ctx: PlanContext, reasons: list[str], record: dict, started: bool) -> Step:
        unit = unit_name(ctx.host.service)
        body = ('set -e; systemctl daemon-reload; systemctl restart -- "$1"; mkdir -p -- "$(dirname -- "$2")"; '
                'printf "%s\\n" "$3" > "$2.tmp"; mv -f -- "$2.tmp" "$2"')
        return Step(role=name, title=f"{'restart' if started else 'start'} {unit}", reason="; ".join(reasons),
                    commands=(Cmd.of("bash", "-c", body, "restart", unit, record_path(ctx.host),
                                     json.dumps(record, sort_keys=True)),),
                    # No is-active check here: it races a crashing server; gpufleet.fleet.health.Gate is the verification.
                    changes=("service",))


def plan(ctx: PlanContext) -> list[Step | Unchanged]:
    """The role with no secrets, no download, no outside restart signal."""
    return ModelServer().plan(ctx)
