"""Write a probe's chosen backends into a host's inventory entry, keeping the file's comments and layout (tomlkit)."""

from __future__ import annotations

import os
from pathlib import Path

import tomlkit
from tomlkit.items import InlineTable, Table

from gpufleet.errors import ConfigError


def _child(parent, key: str, created: list):
    """parent[key] as a table, created when absent: inline inside an inline table, a [section] otherwise."""
    if key in parent:
        value = parent[key]
        if not isinstance(value, (Table, InlineTable)):
            raise ConfigError("", f"{key} is not a table")
        return value
    parent[key] = tomlkit.inline_table() if isinstance(parent, InlineTable) else tomlkit.table()
    created.append(parent[key])
    return parent[key]


def set_host_server_keys(text: str, host: str, changes: dict[str, str], *, path: str = "inventory") -> str:
    """text with [hosts.<host>.stack.server] keys set (dotted keys reach sub-tables: speculative.algorithm).

    Only those keys change; every other line, comment and table stays as written."""
    doc = tomlkit.parse(text)
    hosts = doc.get("hosts")
    if hosts is None or host not in hosts:
        raise ConfigError(path, "the host has no [hosts.<name>] entry in this file to write the chosen backends "
                                "into", host=host)
    created: list = []
    try:
        server = _child(_child(hosts[host], "stack", created), "server", created)
        for dotted, value in changes.items():
            *tables, key = dotted.split(".")
            target = server
            for name in tables:
                target = _child(target, name, created)
            target[key] = value
    except ConfigError as exc:
        raise ConfigError(path, f"cannot write the chosen backends: {exc.problem}", host=host,
                          field=f"hosts.{host}.stack.server") from None
    sections = [t for t in created if isinstance(t, Table) and not t.is_super_table()]
    if sections:
        sections[-1].add(tomlkit.nl())  # the last new [section] is rendered last: a blank line before the next one
    return tomlkit.dumps(doc)


def write_host_server_keys(path: str | Path, host: str, changes: dict[str, str]) -> None:
    """Rewrite the inventory file atomically (same mode) with the host's server keys changed."""
    p = Path(path)
    new = set_host_server_keys(p.read_text(), host, changes, path=str(p))
    tmp = p.with_name(p.name + ".gpufleet-tmp")
    tmp.write_text(new)
    os.chmod(tmp, p.stat().st_mode & 0o7777)
    tmp.replace(p)
