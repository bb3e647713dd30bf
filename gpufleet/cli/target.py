"""One task's target, resolved once: the loaded inventory and stack, the selected hosts and the task's flags."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.cli.common import command_line, load, selection
from gpufleet.cli.fleetdir import fleet_dir
from gpufleet.config.inventory import Host, Inventory
from gpufleet.config.stack import Stack, host_stacks
from gpufleet.errors import ConfigError

if TYPE_CHECKING:  # the lock module (tomlkit) is read only with --lock or a resumed roll; the roll module only by
    # tasks that roll (it pulls in the hosts' state files and the engine before `inv status` needs them)
    from gpufleet.config.lock import FleetLock
    from gpufleet.fleet.roll import RollSummary
    from gpufleet.roleapi import Selection  # the role registry's API: read by tasks given --only / --skip


def _load_lock(path) -> FleetLock:
    from gpufleet.config import lock as lock_file  # tomlkit and the lock models: only when a lock is named

    return lock_file.load(path)


@dataclass(frozen=True)
class RollOptions:
    """The roll flags of `inv upgrade` / `inv deploy-model`, as given."""

    canary: str | None = None
    batch: str = "1"
    max_fail: int | str = 0  # as given ("2", "10%"); resolve() makes it the count of hosts
    resume: bool = False
    no_rollback: bool = False
    drain_timeout: float | None = None  # --drain-timeout: seconds (default: the inventory's [router] drain_timeout)
    on_drain_timeout: str | None = None  # --on-drain-timeout cut|wait (default: [router] on_drain_timeout)
    no_speed_gate: bool = False  # --no-speed-gate: skip the throughput gate for this roll


@dataclass(frozen=True)
class Resumed:
    """The stopped roll that --resume continues: its record directory and summary."""

    dir: Path
    summary: RollSummary


@dataclass(frozen=True)
class Target:
    """What one task acts on: loaded and validated before any host is contacted."""

    task: str  # "upgrade", "deploy-model", ...
    command: str  # as typed: recorded in host locks, audit logs and roll records
    inventory: Inventory
    stack: Stack  # stack.toml, before per-host overrides
    hosts: tuple[Host, ...]  # the selected hosts, in inventory order
    stacks: dict[str, Stack] = field(default_factory=dict)  # each selected host's stack (overrides applied)
    json: bool = False
    accept_new_host_keys: bool = False  # already applied to inventory.settings
    dry_run: bool = False
    lock: FleetLock | None = None  # --lock, or the lock of the roll being resumed
    secrets: dict[str, str] = field(default_factory=dict)  # {"HF_TOKEN": ...} when the task needs it
    download: bool = False
    roll: RollOptions | None = None  # the flags, for tasks that can roll
    rolls: bool = False  # several hosts (or --canary / --resume), not a dry run: one host at a time
    batches: tuple[tuple[str, ...], ...] = ()  # when rolling: the canary alone, then the rest
    resumed: Resumed | None = None
    parallel: int | None = None  # --parallel, already applied to inventory.settings.parallelism
    chosen_roles: Selection | None = None  # --only / --skip / --force over the role registry

    @property
    def hidden(self) -> tuple[str, ...]:
        """Secret values to mask in every line shown or recorded."""
        return tuple(self.secrets.values())


def read_hf_token(path: str | None) -> str | None:
    """The Hugging Face token: from the file --hf-token-file names, else $HF_TOKEN; None when neither is set."""
    if path:
        try:
            text = Path(path).expanduser().read_text()
        except OSError as exc:
            raise ConfigError(path, f"cannot read the Hugging Face token file: {exc.strerror}") from None
        if not text.strip():
            raise ConfigError(path, "the Hugging Face token file is empty")
    else:
        text = os.environ.get("HF_TOKEN", "")
    token = text.strip()
    if any(c.isspace() or c in "'\\\"" for c in token):
        where = path or "$HF_TOKEN"
        raise ConfigError(where, "the Hugging Face token must be one word (no spaces, quotes or backslashes)")
    return token or None


def parse_parallel(value) -> int | None:
    """`--parallel N`: how many hosts at once (a whole number, 1 or more); None when not given."""
    if value is None or value == "":
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1:
        raise ConfigError("--parallel", "must be a whole number of hosts, 1 or more", value=value, has_value=True)
    return number


def drain_seconds(value) -> float | None:
    """`--drain-timeout SECONDS`: how long a drained server's requests may take (a positive number); None: not given."""
    if value is None or value == "":
        return None
    try:
        seconds = float(str(value).strip())
    except ValueError:
        seconds = 0.0
    if not 0 < seconds <= 86400 or seconds != seconds:
        raise ConfigError("--drain-timeout", "must be a number of seconds above 0 (at most 86400)", value=value,
                          has_value=True)
    return seconds


def drain_choice(value) -> str | None:
    """`--on-drain-timeout cut|wait`: what a drain does when its timeout passes with requests still in flight."""
    if value is None or value == "":
        return None
    if value not in ("cut", "wait"):
        raise ConfigError("--on-drain-timeout", "must be cut (stop the server anyway, with a warning) or wait (keep "
                          "waiting for the requests to finish)", value=value, has_value=True)
    return value


def role_selection(only: str | None, skip: str | None, force: bool) -> Selection | None:
    """--only / --skip over the upgrade roles (names as the registry gives them); --force without either is an
    error, since it has nothing to force."""
    if only is None and skip is None:
        found = None  # nothing to check against the registry: the roles load later, while the hosts answer
    else:
        from gpufleet.roleapi import select
        from gpufleet.roles import ROLES

        found = select(ROLES, only, skip, force)
    if found is None and force:
        raise ConfigError("--force", "only means something with --only or --skip (run a role although a role it "
                          "needs is left out and not on target)")
    return found


def resolve(task: str, *, inventory: str | None = None, stack: str | None = None, host: str | None = None,
            hosts: str | None = None, all_by_default: bool = False, json: bool = False,
            accept_new_host_keys: bool = False, dry_run: bool = False, lock: str | None = None,
            per_host_stacks: bool = True, token: bool = False, hf_token_file: str | None = None,
            download: bool = False, roll: RollOptions | None = None, parallel=None,
            chosen_roles: Selection | None = None) -> Target:
    """Load, select and validate once for `inv <task>`; every bad input fails here with a ConfigError.

    all_by_default: no --host/--hosts means every host (read-only tasks); else hosts must be named.
    token: the task needs the Hugging Face token (a roll always does: it deploys).
    roll: the task may roll; it does with several hosts, --canary or --resume, unless a dry run.
    parallel: --parallel as given (validated, then the inventory's settings.parallelism for this run)."""
    limit = parse_parallel(parallel)
    inv, base = load(inventory, stack, accept_new_host_keys)
    if limit is not None:
        inv.settings = inv.settings.model_copy(update={"parallelism": limit})
    given = _load_lock(lock) if lock else None
    resumed = None
    if roll is not None:
        from gpufleet.fleet.roll import last_stopped, max_failures, plan_batches, runs_dir
    if roll and roll.resume and not dry_run:
        previous_dir, previous = last_stopped(runs_dir(fleet_dir() / "runs"), task, str(inv.path.resolve()))
        resumed = Resumed(previous_dir, previous)
        chosen = selection(inv, None, ",".join(previous.hosts))
        if given is None and previous.lock:
            given = _load_lock(previous.lock)  # the resumed roll's hosts converge to the same lock
    else:
        chosen = selection(inv, host, hosts, default="all" if all_by_default else None)
    if roll is not None:
        roll = replace(roll, max_fail=max_failures(roll.max_fail, len(chosen)),
                       drain_timeout=drain_seconds(roll.drain_timeout),
                       on_drain_timeout=drain_choice(roll.on_drain_timeout))
    rolls = bool(roll) and not dry_run and (roll.resume or bool(roll.canary) or len(chosen) > 1)
    if resumed:
        batches = resumed.summary.batches
    elif rolls:
        batches = plan_batches([h.name for h in chosen], roll.canary, roll.batch)
    else:
        batches = []
    stacks = host_stacks(base, inv, chosen) if per_host_stacks else {}  # bad overrides fail here
    secret = read_hf_token(hf_token_file) if token or rolls else None
    return Target(task=task, command=command_line(task), inventory=inv, stack=base, hosts=tuple(chosen),
                  stacks=stacks, json=json, accept_new_host_keys=accept_new_host_keys, dry_run=dry_run, lock=given,
                  secrets={"HF_TOKEN": secret} if secret else {}, download=download, roll=roll, rolls=rolls,
                  batches=tuple(tuple(b) for b in batches), resumed=resumed, parallel=limit, chosen_roles=chosen_roles)
