"""Logins begun before the inventory is validated: `inv status` opens the sessions the last validated run of the same
inventory file (the same bytes, path and flags) logged in with, while pydantic loads and validates (issue 13).

What a login needs (each host's address, port, user and key, the [settings]) is remembered on the control node as
the validated inventory gave it (`view`). A run whose inventory file is byte for byte the remembered one opens those
sessions at once, from the remembered values; once its own validation is done, it takes them only if its validated
view is the remembered one, and otherwise closes them and logs in as any run does. Nothing runs on a host before the
validation: a login changes nothing there, and an inventory that changed (a host removed, an address edited) is never
logged into from what an older one said. Hosts behind a jump host or logging in to sudo (`become`) are left to the
regular path: their sessions need the validated inventory itself; so is every host while new host keys are accepted
(a login would record them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gpufleet.cachedir import cache_root, keep_memo
from gpufleet.cli.common import inventory_path
from gpufleet.errors import GpufleetError

FORMAT = 1  # the remembered record's shape


def memo_dir() -> Path:
    """Where the remembered views live: beside the plan memory, under the control node's cache."""
    return cache_root() / "logins"


def host_view(host) -> dict:
    """What one host's login is made of (engine/ssh.py's HostSession reads no other host field before the exec)."""
    identity = host.identity_file
    return {"name": host.name, "address": host.address, "port": host.port, "user": host.user,
            "identity_file": None if identity is None else str(identity), "jump": host.jump,
            "become": bool(host.become)}


def view(hosts, settings) -> dict:
    """The logins of one run: its selected hosts, in order, and its [settings] (with which fields were given)."""
    return {"format": FORMAT, "hosts": [host_view(h) for h in hosts], "settings": settings.model_dump(mode="json"),
            "settings_given": sorted(settings.model_fields_set)}


class _HostView:
    """A host as a login needs it, from a remembered view."""

    def __init__(self, data: dict):
        self.name, self.address, self.port, self.user = data["name"], data["address"], data["port"], data["user"]
        self.identity_file, self.jump, self.become = data["identity_file"], data["jump"], data["become"]


class _SettingsView:
    """The [settings] as a login needs them, from a remembered view."""

    def __init__(self, values: dict, given: list[str]):
        self.__dict__.update(values)
        self.model_fields_set = set(given)


class _InventoryView:
    """What engine/runner.py's open_ahead reads of an inventory: its settings, and no jump hosts."""

    def __init__(self, settings: _SettingsView):
        self.settings = settings
        self.hosts: dict = {}


class EarlyLogins:
    """One run's logins begun from a remembered view (or none), confirmed or closed once its inventory is valid."""

    def __init__(self, key: str | None, inventory_sha256: str | None, remembered: dict | None):
        self.key, self.inventory_sha256, self.remembered = key, inventory_sha256, remembered
        self.opened = None  # engine.runner.Opened
        self.dialed = None  # engine.dial.Dialed

    def start(self) -> None:
        """Dial, import paramiko while the TCP handshakes go, and start each login in a thread of its own."""
        data = self.remembered
        settings = _SettingsView(data["settings"], data["settings_given"])
        if settings.accept_new_host_keys:
            return  # a login would record new host keys before the run is known to be valid: after it, then
        hosts = [_HostView(h) for h in data["hosts"] if not h["jump"] and not h["become"]]
        from gpufleet.engine.dial import dial

        self.dialed = dial(hosts, settings)
        from gpufleet.engine.runner import open_ahead  # paramiko and Fabric: while the hosts answer the TCP handshake

        self.opened = open_ahead(hosts, _InventoryView(settings), dialed=self.dialed, adopted=True)

    def confirm(self, hosts, settings):
        """The sessions begun, when the validated run logs in exactly as remembered; else None, having closed them
        (and remembered the validated view for the next run)."""
        found = view(hosts, settings)
        if found == self.remembered and self.opened is not None:
            return self.opened
        self.close()
        if self.key is not None and found != self.remembered:
            self._remember(found)
        return None

    def _remember(self, found: dict) -> None:
        # a control node whose cache cannot be written logs in after the validation every time
        keep_memo(memo_dir() / self.key, json.dumps({**found, "inventory_sha256": self.inventory_sha256}))

    def close(self) -> None:
        """Close what was begun and not taken (never waits for a login still under way)."""
        if self.opened is not None:
            self.opened.close()
            self.opened = None
        if self.dialed is not None:
            self.dialed.close()
            self.dialed = None

    def __enter__(self) -> "EarlyLogins":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def begin(task: str, *, inventory: str | None, flags: dict, skip: bool = False) -> EarlyLogins:
    """Start the logins the last validated `task` run over this inventory file and these flags made, when the file is
    byte for byte what that run validated; none when it cannot be read (the validation reports why) or `skip`."""
    if skip:
        return EarlyLogins(None, None, None)
    try:
        path = inventory_path(inventory)
        data = path.read_bytes()
        where = str(path.resolve())
    except (OSError, GpufleetError):
        return EarlyLogins(None, None, None)
    key = hashlib.sha256(json.dumps([task, where, flags], sort_keys=True, default=str).encode()).hexdigest()
    digest = hashlib.sha256(data).hexdigest()
    try:
        remembered = json.loads((memo_dir() / key).read_text())
    except (OSError, ValueError):
        remembered = None
    if not isinstance(remembered, dict) or remembered.pop("inventory_sha256", None) != digest \
            or remembered.get("format") != FORMAT:
        return EarlyLogins(key, digest, None)
    early = EarlyLogins(key, digest, remembered)
    try:
        early.start()
    except (KeyError, TypeError, AttributeError):  # a remembered record of another shape: log in as usual
        early.close()
        early.remembered = None
    return early
