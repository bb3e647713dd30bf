"""The inventory (hosts/*.toml): settings, groups and hosts, validated; host selection."""

from __future__ import annotations

import fnmatch

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from gpufleet.config.util import (LocalPath, RemotePath, check_name, deep_merge, key_text, read_toml,
                                  unknown_key_problem, validation_error)
from gpufleet.errors import ConfigError

_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)  # 1e400 is inf in TOML
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_JUMP_RE = re.compile(r"^(?P<user>[^@\s]+)@(?P<host>\[[0-9A-Fa-f:.]+\]|[^@\s:\[\]]+)(?::(?P<port>\d{1,5}))?$")
_JUMP_FORM = "user@host[:port]"
_TOP_KEYS = ("settings", "defaults", "groups", "hosts", "router")


class Settings(BaseModel):
    """Fleet-wide connection settings ([settings])."""

    model_config = _STRICT
    parallelism: int = Field(16, ge=1)
    connect_timeout: float = Field(10.0, gt=0, le=3600)
    keepalive: float = Field(15.0, ge=0, le=3600)  # seconds; 0 turns keepalive off
    known_hosts: LocalPath = Path("~/.ssh/known_hosts").expanduser()
    ssh_config: LocalPath | None = Path("~/.ssh/config").expanduser()  # where unset port/user come from
    accept_new_host_keys: bool = False
    command_timeout: float | None = Field(None, gt=0, le=7 * 86400)
    snapshots_keep: int = Field(5, ge=1)  # per host, pruned after a successful run; never the one it just took
    # seconds a rollback keeps trying to reach a host that dropped off (rebooting, a cut link) before giving up
    reconnect_for: float = Field(600.0, gt=0, le=86400)


class GpuExpectation(BaseModel):
    """What a host's GPUs must look like: count, compute capability ("12.0"), optional name substring."""

    model_config = _STRICT
    count: int = Field(8, ge=1)
    compute_capability: str = "12.0"
    name: str | None = None

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _cc(cls, v: object) -> object:
        if not isinstance(v, str) or not re.fullmatch(r"\d+\.\d+", v):
            raise ValueError('must be a string like "12.0" (quoted: a bare 12.0 is a float)')
        return v


class Host(BaseModel):
    """One GPU server; local paths are Path, remote paths are absolute POSIX strings."""

    model_config = _STRICT
    name: str
    address: str
    port: int | None = Field(None, ge=1, le=65535)
    user: str | None = None
    identity_file: LocalPath | None = None
    jump: str | None = None
    venv: RemotePath = "/root/venv"
    sglang_checkout: RemotePath = "/root/sglang-main"
    service: str = "sglang"
    model_path: RemotePath = "/models/Qwen3.5-397B-A17B-NVFP4"
    gpus: GpuExpectation = GpuExpectation()
    groups: list[str] = []
    stack_overrides: dict[str, Any] = {}
    # Become: a non-root login runs privileged commands through sudo (gpufleet/engine/become.py).
    become: bool = False
    become_user: str = "root"
    become_password_file: LocalPath | None = None  # the sudo password, first line of a file
    become_password_env: str | None = None  # or an environment variable of the control node
    # The URL the router ([router]) knows this host's server by; unset: http://<address>:<stack server port>.
    worker_url: str | None = None
    _become_password: str | None = PrivateAttr(default=None)  # read at load time; never dumped or shown

    @property
    def become_password(self) -> str | None:
        """The sudo password (from become_password_file or become_password_env), None when sudo needs none."""
        return self._become_password

    @field_validator("become_user")
    @classmethod
    def _become_user(cls, v: str) -> str:
        if not _USER_RE.match(v):
            raise ValueError("must be a plain user name")
        return v

    @field_validator("become_password_env")
    @classmethod
    def _become_env(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("must be an environment variable's name")
        return v

    @field_validator("worker_url")
    @classmethod
    def _worker_url(cls, v: str | None) -> str | None:
        return v if v is None else check_http_url(v, with_path=False)

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if _is_ip(v) or _HOSTNAME_RE.match(v):
            return v
        raise ValueError("must be a hostname or IP address (put the login name in 'user')")

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not _USER_RE.match(v):
            raise ValueError("must be a plain login name")
        return v

    @field_validator("service")
    @classmethod
    def _service(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*", v):
            raise ValueError("must be a systemd unit name")
        return v.removesuffix(".service")


def check_http_url(value: str, *, with_path: bool = True) -> str:
    """An http(s) URL with a host (and, unless with_path, nothing after host:port); the URL without a trailing /."""
    parsed = urlsplit(value)
    try:
        parsed.port  # noqa: B018 (a port out of range raises here)
    except ValueError:
        raise ValueError("has a bad port") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError("must be an http:// or https:// URL with a host, like http://10.0.0.5:30000")
    if parsed.username or parsed.password:
        raise ValueError("must not carry credentials (use api_key_file or api_key_env)")
    if parsed.query or parsed.fragment or (not with_path and parsed.path not in ("", "/")):
        raise ValueError("must be scheme://host:port only")
    return value.rstrip("/")


class Router(BaseModel):
    """The SGLang router (sglang-router / SGLang Model Gateway) the fleet serves behind ([router]): where its
    admin API is, how to reach it, its API key (read at load time, never shown) and how rolls drain through it."""

    model_config = _STRICT
    admin_url: str  # e.g. http://10.20.0.5:30000, as seen from the control node, or from `via`
    via: str | None = None  # an inventory host: the admin URL is reached through an SSH tunnel over its connection
    api_key_file: LocalPath | None = None  # the router's API key (--api-key): first line of a file
    api_key_env: str | None = None  # or an environment variable of the control node
    drain_timeout: float = Field(300.0, gt=0, le=86400)  # seconds for a drained server's requests to finish
    on_drain_timeout: Literal["cut", "wait"] = "cut"  # cut: stop anyway with a warning; wait: keep waiting
    rejoin_timeout: float = Field(300.0, gt=0, le=86400)  # seconds for the router to report a re-added worker healthy
    _api_key: str | None = PrivateAttr(default=None)

    @property
    def api_key(self) -> str | None:
        """The router's API key (from api_key_file or api_key_env), None when it needs none."""
        return self._api_key

    @field_validator("admin_url")
    @classmethod
    def _admin_url(cls, v: str) -> str:
        return check_http_url(v, with_path=False)

    @field_validator("api_key_env")
    @classmethod
    def _key_env(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("must be an environment variable's name")
        return v


# TOML keys of a host table: the model's fields, with 'stack' standing in for stack_overrides.
HOST_KEYS = [k for k in Host.model_fields if k not in ("name", "stack_overrides")] + ["stack"]


@dataclass
class Inventory:
    """A loaded inventory: hosts in file order, groups (name -> host names in inventory order)."""

    path: Path
    settings: Settings
    hosts: dict[str, Host] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    router: Router | None = None  # [router]: rolls drain each host's worker through it

    def jump_host(self, spec: str) -> Host:
        """The host a `jump` value names: an inventory host, or a bare Host built from user@host[:port]."""
        if spec in self.hosts:
            return self.hosts[spec]
        host = _host_from_jump(spec)
        if host is None:
            raise ConfigError(str(self.path), f"must name an inventory host or have the form {_JUMP_FORM}",
                              field="jump", value=spec, has_value=True)
        return host


def _host_from_jump(spec: str) -> Host | None:
    m = _JUMP_RE.match(spec)
    if not m:
        return None
    try:
        port = int(m.group("port")) if m.group("port") else None
        return Host(name=spec, address=m.group("host").strip("[]"), user=m.group("user"), port=port)
    except ValidationError:
        return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate an inventory file; any user mistake raises ConfigError."""
    p = Path(path)
    raw = read_toml(p)
    _check_keys(p, raw, _TOP_KEYS, None, "")
    ctx = {"base_dir": p.parent.resolve()}
    settings = _settings(p, _table(p, raw, "settings", None), ctx)
    declared = _declared_groups(p, _table(p, raw, "groups", None))
    defaults = _table(p, raw, "defaults", None)
    _check_keys(p, defaults, HOST_KEYS, None, "defaults.")
    hosts_raw = _table(p, raw, "hosts", None)
    if not hosts_raw:
        raise ConfigError(str(p), "defines no hosts (add [hosts.<name>] tables)", field="hosts")
    hosts = {name: _host(p, name, defaults, entry, ctx) for name, entry in hosts_raw.items()}
    groups = _resolve_groups(p, hosts, declared)
    hosts = {n: _with_groups(h, [g for g in groups if n in groups[g]]) for n, h in hosts.items()}
    _check_jumps(p, hosts)
    router = _router(p, raw, hosts, ctx) if "router" in raw else None
    return Inventory(path=p, settings=settings, hosts=hosts, groups=groups, router=router)


def _router(path: Path, raw: dict, hosts: dict[str, Host], ctx: dict) -> Router:
    """[router], validated; its API key read now (a mistake is a ConfigError before any connection)."""
    data = _table(path, raw, "router", None)
    try:
        router = Router.model_validate(data, context=ctx)
    except ValidationError as exc:
        raise validation_error(exc, path, Router, prefix=("router",)) from None
    if router.via is not None and router.via not in hosts:
        raise ConfigError(str(path), f"must name an inventory host; inventory hosts: {', '.join(hosts)}",
                          field="router.via", value=router.via, has_value=True)
    router._api_key = _secret(path, router.api_key_file, router.api_key_env, "router.api_key", "router's API key",
                              None)
    return router


def _secret(path: Path, file: Path | None, env: str | None, fld: str, what: str, host: str | None) -> str | None:
    """A secret from the first line of a file or from an environment variable (not both); None when neither."""
    if file is not None and env is not None:
        raise ConfigError(str(path), f"set {fld}_file or {fld}_env, not both", host=host, field=f"{fld}_env",
                          value=env, has_value=True)
    if file is not None:
        try:
            lines = Path(file).read_text().splitlines()
        except OSError as exc:
            raise ConfigError(str(path), f"cannot read the {what} file: {exc.strerror or exc}", host=host,
                              field=f"{fld}_file", value=str(file), has_value=True) from None
        if not lines or not lines[0].strip():
            raise ConfigError(str(path), f"the {what} file is empty", host=host, field=f"{fld}_file",
                              value=str(file), has_value=True)
        return lines[0].strip()
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise ConfigError(str(path), f"the environment variable holding the {what} is unset or empty",
                              host=host, field=f"{fld}_env", value=env, has_value=True)
        return value
    return None


def _with_groups(host: Host, groups: list[str]) -> Host:
    copy = host.model_copy(update={"groups": groups})
    copy._become_password = host._become_password
    return copy


def _table(path: Path, parent: dict, key: str, host: str | None, prefix: str = "") -> dict[str, Any]:
    value = parent.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(str(path), "must be a table", host=host, field=prefix + key, value=value, has_value=True)
    return value


def _check_keys(path: Path, table: dict, allowed: list[str] | tuple[str, ...], host: str | None,
                prefix: str) -> None:
    for key, value in table.items():
        if key not in allowed:
            raise ConfigError(str(path), unknown_key_problem(list(allowed)), host=host, field=prefix + key_text(key),
                              value=value, has_value=True)


def _settings(path: Path, data: dict, ctx: dict) -> Settings:
    try:
        return Settings.model_validate(data, context=ctx)
    except ValidationError as exc:
        raise validation_error(exc, path, Settings, prefix=("settings",)) from None


def _declared_groups(path: Path, data: dict) -> dict[str, list[str]]:
    for name, members in data.items():
        _name_or_error(path, name, "group", None, "groups")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise ConfigError(str(path), "must be a list of host names", field=f"groups.{name}",
                              value=members, has_value=True)
    return data


def _name_or_error(path: Path, name: str, what: str, host: str | None, fld: str | None) -> None:
    try:
        check_name(name, what)
    except ValueError as exc:
        raise ConfigError(str(path), str(exc), host=host, field=fld, value=name, has_value=True) from None


def _host(path: Path, name: str, defaults: dict, entry: object, ctx: dict) -> Host:
    _name_or_error(path, name, "host", name, "hosts")
    if not isinstance(entry, dict):
        raise ConfigError(str(path), "must be a table", host=name, field=f"hosts.{name}", value=entry,
                          has_value=True)
    _check_keys(path, entry, HOST_KEYS, name, "")
    if "address" not in entry and "address" not in defaults:
        raise ConfigError(str(path), "required field is missing (hostname or IP address)", host=name,
                          field="address")
    data = deep_merge({k: v for k, v in defaults.items() if k != "stack"},
                      {k: v for k, v in entry.items() if k != "stack"})
    overrides = deep_merge(_table(path, defaults, "stack", name, "defaults."), _table(path, entry, "stack", name))
    try:
        host = Host.model_validate({**data, "name": name, "stack_overrides": overrides}, context=ctx)
    except ValidationError as exc:
        raise validation_error(exc, path, Host, host=name) from None
    host._become_password = _become_password(path, host)
    return host


def _become_password(path: Path, host: Host) -> str | None:
    """The sudo password a host's become settings name, read now: every mistake is a ConfigError before any
    connection (never a prompt: a parallel run has no one to answer it)."""
    pw_file, pw_env = host.become_password_file, host.become_password_env
    if pw_file is not None and pw_env is not None:
        raise ConfigError(str(path), "set become_password_file or become_password_env, not both", host=host.name,
                          field="become_password_env", value=pw_env, has_value=True)
    if (pw_file is not None or pw_env is not None) and not host.become:
        fld = "become_password_file" if pw_file is not None else "become_password_env"
        raise ConfigError(str(path), "a sudo password is only used with become = true", host=host.name,
                          field=fld, value=str(pw_file) if pw_file is not None else pw_env, has_value=True)
    if pw_file is not None:
        try:
            text = Path(pw_file).read_text()
        except OSError as exc:
            raise ConfigError(str(path), f"cannot read the sudo password file: {exc.strerror or exc}",
                              host=host.name, field="become_password_file", value=str(pw_file),
                              has_value=True) from None
        password = text.splitlines()[0] if text.splitlines() else ""
        if not password:
            raise ConfigError(str(path), "the sudo password file is empty", host=host.name,
                              field="become_password_file", value=str(pw_file), has_value=True)
        return password
    if pw_env is not None:
        password = os.environ.get(pw_env)
        if not password:
            raise ConfigError(str(path), "the environment variable holding the sudo password is unset or empty",
                              host=host.name, field="become_password_env", value=pw_env, has_value=True)
        return password
    return None


def _resolve_groups(path: Path, hosts: dict[str, Host], declared: dict[str, list[str]]) -> dict[str, list[str]]:
    """Membership from both sides ([groups] lists and each host's 'groups'), in inventory order."""
    known_hosts = ", ".join(hosts)
    for group, members in declared.items():
        if group in hosts:
            raise ConfigError(str(path), "a group cannot share its name with a host (selection would be "
                              "ambiguous)", field=f"groups.{group}", value=group, has_value=True)
        for member in members:
            if member not in hosts:
                raise ConfigError(str(path), f"group names an unknown host; known hosts: {known_hosts}",
                                  field=f"groups.{group}", value=member, has_value=True)
    for host in hosts.values():
        for group in host.groups:
            if group not in declared:
                known = ", ".join(declared) or "none (declare them in [groups])"
                raise ConfigError(str(path), f"unknown group; declared groups: {known}", host=host.name,
                                  field="groups", value=group, has_value=True)
    return {g: [h for h in hosts if h in members or g in hosts[h].groups] for g, members in declared.items()}


def _check_jumps(path: Path, hosts: dict[str, Host]) -> None:
    for host in hosts.values():
        if host.jump is None or host.jump in hosts:
            _check_jump_chain(path, hosts, host)
            continue
        if _host_from_jump(host.jump) is None:
            raise ConfigError(str(path), f"must name another inventory host or have the form {_JUMP_FORM}; "
                              f"inventory hosts: {', '.join(hosts)}", host=host.name, field="jump",
                              value=host.jump, has_value=True)


def _check_jump_chain(path: Path, hosts: dict[str, Host], host: Host) -> None:
    seen = [host.name]
    nxt = host.jump
    while nxt is not None and nxt in hosts:
        if nxt in seen:
            chain = " -> ".join(seen + [nxt])
            raise ConfigError(str(path), f"jump hosts form a loop ({chain})", host=host.name, field="jump",
                              value=host.jump, has_value=True)
        seen.append(nxt)
        nxt = hosts[nxt].jump


def select_hosts(inv: Inventory, spec: str) -> list[Host]:
    """Hosts named by spec, in inventory order, once each: comma-separated names, groups, `all`, shell-style
    patterns (`gpu*`, `gpu[1-3]`), and `!part` to leave out what part names (`gpu*,!gpu3`; only `!` parts start
    from all hosts)."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or all(p == "!" for p in parts):
        raise ConfigError(str(inv.path), "empty host selection; name hosts, groups, patterns like 'gpu*' or 'all'",
                          value=spec, has_value=True)
    keep = [p for p in parts if not p.startswith("!")]
    drop = [p[1:].strip() for p in parts if p.startswith("!")]
    wanted: set[str] = set(inv.hosts) if not keep else set()
    for part in keep:
        wanted.update(_expand(inv, part))
    for part in drop:
        wanted.difference_update(_expand(inv, part))
    chosen = [h for name, h in inv.hosts.items() if name in wanted]
    if not chosen:
        raise ConfigError(str(inv.path), "the host selection leaves no host", value=spec, has_value=True)
    return chosen


def _expand(inv: Inventory, part: str) -> list[str]:
    if part == "all":
        return list(inv.hosts)
    if part in inv.hosts:
        return [part]
    if part in inv.groups:
        return inv.groups[part]
    if any(c in part for c in "*?["):
        # a pattern names hosts and the hosts of groups it matches, as Ansible's do
        names = [n for n in inv.hosts if fnmatch.fnmatchcase(n, part)]
        for group, members in inv.groups.items():
            if fnmatch.fnmatchcase(group, part):
                names += members
        if names:
            return names
        raise ConfigError(str(inv.path), f"host pattern {part!r} matches no host or group; known hosts: "
                          f"{', '.join(inv.hosts)}", value=part, has_value=True)
    groups = ", ".join(inv.groups) or "none"
    raise ConfigError(str(inv.path), f"unknown host or group {part!r} in host selection; known hosts: "
                      f"{', '.join(inv.hosts)}; known groups: {groups}; or 'all'", value=part, has_value=True)
