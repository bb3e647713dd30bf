"""What the Invoke tasks do: load config, select hosts, run, render, and turn user errors into clean exits."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Exit

from gpufleet.cli.fleetdir import fleet_dir, prog
from gpufleet.errors import ConfigError, GpufleetError, UnreachableError

# Imported where used, not here: every task imports this module, and rich, the roles (jinja2), paramiko and the
# pydantic models they pull in cost most of a second of CPU before the first SSH packet (issue 13). `status` and
# `facts` import the connection side first and what reads the answers only once the hosts are being asked.
if TYPE_CHECKING:
    from gpufleet.cli.target import Target
    from gpufleet.config.inventory import Inventory
    from gpufleet.config.stack import Stack

DEFAULT_INVENTORY = "hosts/sim.toml"
DEFAULT_STACK = "stack.toml"


def command_line(task: str) -> str:
    """The command as the user typed it (recorded in host locks, audit logs and roll records)."""
    import shlex
    import sys

    return shlex.join([prog(), *sys.argv[1:]]) if len(sys.argv) > 1 else f"{prog()} {task}"


def plan_memory(kind: str):
    """Each host's last plan-time reads (engine/readahead.py's Memory) for one kind of plan: "upgrade" (one host's
    `inv upgrade`), "survey-upgrade" and "survey-deploy-model" (a roll's read-only survey)."""
    from gpufleet.engine import readahead
    from gpufleet.cachedir import cache_root

    # a folder per kind: their roles differ (a one-host upgrade plans no model server, deploy-model's survey only
    # the model server), and one memory for all had each kind forget what the other reads: after a one-host
    # upgrade, the next roll's survey asked the model files, the unit's state and the build record in a round trip
    # each, one after the other
    return readahead.Memory(cache_root() / "reads" / kind)


# Exit codes, the same in every task (README: "Exit codes").
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
UNREACHABLE_KINDS = ("unreachable",)  # a refused host key is a failure (1): someone must look at it


def exit_code(kinds) -> int:
    """One exit code from each host's outcome kind ("ok", "unreachable", anything else a failure or drift): 0 when
    all are ok, 3 when the only problem is hosts that could not be reached, else 1."""
    bad = [k for k in kinds if k != "ok"]
    if not bad:
        return EXIT_OK
    return EXIT_UNREACHABLE if all(k in UNREACHABLE_KINDS for k in bad) else EXIT_FAILED


def user_errors(fn):
    """Print a GpufleetError as one clear message without a stack trace: exit 2 for bad input, 3 when a host could
    not be reached, 1 for any other failure; Ctrl-C exits 130 with one line."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            raise Exit("interrupted", code=EXIT_INTERRUPTED) from None
        except UnreachableError as exc:
            raise Exit(f"error: {exc}", code=EXIT_UNREACHABLE) from None
        except ConfigError as exc:
            raise Exit(f"error: {exc}", code=EXIT_BAD_INPUT) from None
        except GpufleetError as exc:
            raise Exit(f"error: {exc}", code=EXIT_FAILED) from None
    return wrapper


def inventory_path(explicit: str | None) -> Path:
    """--inventory, else $GPUFLEET_INVENTORY, else the fleet directory's hosts/sim.toml."""
    path = Path(explicit or os.environ.get("GPUFLEET_INVENTORY") or fleet_dir() / DEFAULT_INVENTORY)
    if not path.exists() and not explicit and not os.environ.get("GPUFLEET_INVENTORY"):
        found = ", ".join(f"hosts/{p.name}" for p in sorted(path.parent.glob("*.toml"))) or "none"
        raise ConfigError(str(path), f"no inventory: run `{prog()} sim.up` for the simulated fleet, or pass "
                                     f"--inventory hosts/<fleet>.toml (or set GPUFLEET_INVENTORY); in "
                                     f"{path.parent}: {found}")
    return path


def stack_path(explicit: str | None) -> Path:
    """--stack, else $GPUFLEET_STACK, else the fleet directory's stack.toml."""
    path = Path(explicit or os.environ.get("GPUFLEET_STACK") or fleet_dir() / DEFAULT_STACK)
    if not path.exists() and not explicit and not os.environ.get("GPUFLEET_STACK"):
        raise ConfigError(str(path), f"no stack.toml in the fleet directory: run there (or pass --fleet DIR, or set "
                                     f"GPUFLEET_DIR), or `{prog()} init` to write a starting set")
    return path


def load(inventory: str | None, stack: str | None, accept_new_host_keys: bool = False) -> tuple[Inventory, Stack]:
    from gpufleet.config.inventory import load_inventory
    from gpufleet.config.stack import load_stack

    inv = load_inventory(inventory_path(inventory))
    if accept_new_host_keys:
        inv.settings = inv.settings.model_copy(update={"accept_new_host_keys": True})
    st = load_stack(stack_path(stack))
    return inv, st


def selection(inv: Inventory, host: str | None, hosts: str | None, default: str | None = "all") -> list:
    from gpufleet.config.inventory import select_hosts

    spec = ",".join(filter(None, [host, hosts])) or default
    if not spec:
        raise ConfigError(str(inv.path), "name the hosts: --host NAME, --hosts a,b, a group, or all")
    return select_hosts(inv, spec)


def facts(target: Target) -> int:
    """`inv facts`: each selected host's facts, as tables or JSON; 1 when any host could not be read."""
    from gpufleet.engine.dial import dial

    as_json = target.json
    with dial(list(target.hosts), target.inventory.settings) as dialed:
        from gpufleet.engine.runner import for_each_host  # paramiko: imported while the hosts answer the TCP handshake
        from gpufleet.facts.gather import gather_facts

        outcomes = for_each_host(list(target.hosts), target.inventory, gather_facts, dialed=dialed)
    from rich.markup import escape

    from gpufleet.cli import render

    data = []
    for out in outcomes:
        if out.ok:
            data.append(out.value.model_dump(mode="json"))
            if not as_json:
                render.print_facts(out.value)
        else:
            data.append({"host": out.host, "error": out.error, "kind": out.kind})
            if not as_json:
                render.console.print(f"[red]{escape(out.host)}[/]: {escape(out.error or '')}")
    if as_json:
        render.print_json(data if len(data) != 1 else data[0])
    return exit_code(out.kind for out in outcomes)


def facts_and_lock(session, sent=None):
    """A host's facts and its lock (a Claim, or None when free), both read in one exec round trip; sent() is called
    once that exec is on its way."""
    from gpufleet.engine.batch import run_side_by_side
    from gpufleet.engine.query import answer
    from gpufleet.facts.gather import facts_query
    from gpufleet.fleet import hoststate

    query = facts_query(session.host)
    facts, lock = run_side_by_side(session, [(query.cmd, query.step), (hoststate.holder_cmd(), hoststate.HOLDER_STEP)],
                                   sent=sent)
    return answer(session.name, query, facts), hoststate.holder_of(lock.exit_code, lock.output)


class AllSent:
    """Set once every host's exec is on its way (or the run is over): what only reads the answers waits for it."""

    def __init__(self, hosts: int):
        self.left = hosts
        self.event = threading.Event()
        self._lock = threading.Lock()
        if hosts <= 0:
            self.event.set()

    def arrive(self) -> None:
        with self._lock:
            self.left -= 1
            if self.left <= 0:
                self.event.set()


def _load_ahead(ready: threading.Event) -> None:
    """Import, in a thread while the hosts log in, what the facts exec needs (its script, the parsers' models): sshd
    spends tens of ms setting up the login session before it answers, and this CPU fits in that wait instead of
    following it. Then, once every exec is sent (`ready`), what compares facts with a stack (the roles, jinja2)
    and the unit's template, while the hosts run their facts. Not before: under the GIL a busy thread during the
    handshakes delays each packet's handoff between threads (up to the 5 ms switch interval each). A failure here
    is left to the same import in the main thread to report."""
    try:
        from gpufleet.engine import batch, query  # noqa: F401
        from gpufleet.facts import parse, script  # noqa: F401
        from gpufleet.fleet import hoststate  # noqa: F401
    except Exception:  # noqa: BLE001
        pass
    ready.wait()
    try:
        from gpufleet.fleet import status  # noqa: F401
    except Exception:  # noqa: BLE001
        pass


def held_lock(claim) -> dict | None:
    """A host's lock as `inv status` shows it: the holder, and whether it still runs (live / stale / unknown)."""
    if claim is None:
        return None
    from gpufleet.fleet import hoststate

    state, why = hoststate.liveness(claim)
    return {"holder": claim.described, "state": state, "why": why}


def status(target: Target, opened=None) -> int:
    """`inv status`: each selected host against its stack (overrides resolved before any connection), and the
    holder of each host lock that is held. opened: sessions begun before the validation (cli/early.py), taken
    instead of dialling those hosts."""
    from gpufleet.engine.dial import dial

    stacks = target.stacks
    begun = opened.names() if opened is not None else set()
    with dial([h for h in target.hosts if h.name not in begun], target.inventory.settings) as dialed:
        from gpufleet.engine.runner import for_each_host  # paramiko: imported while the hosts answer the TCP handshake

        sent = AllSent(len(target.hosts))  # a host that cannot be reached never sends: the run's end releases it
        loading = threading.Thread(target=_load_ahead, args=(sent.event,), name="gpufleet-load", daemon=True)
        loading.start()
        try:
            outcomes = for_each_host(list(target.hosts), target.inventory,
                                     functools.partial(facts_and_lock, sent=sent.arrive), dialed=dialed,
                                     opened=opened)
        finally:
            sent.event.set()
        loading.join()
    from gpufleet.fleet.status import compare, unreachable

    rows, locks = [], {}
    for h, out in zip(target.hosts, outcomes):
        rows.append(compare(h, stacks[h.name], out.value[0]) if out.ok else unreachable(h.name, out.error, out.kind))
        locks[h.name] = held_lock(out.value[1]) if out.ok else None
    _router_columns(target, rows)
    if target.json:
        from gpufleet.cli.jsonout import print_json

        print_json([{**r.to_json(), "lock": locks[h.name]} for h, r in zip(target.hosts, rows)])
    else:
        from rich.markup import escape

        from gpufleet.cli import render

        render.print_status(rows)
        for name, held in locks.items():
            if held:
                style = "yellow" if held["state"] == "live" else "red"
                render.console.print(f"[{style}]{escape(name)}: locked[/] by {escape(held['holder'])}: "
                                     f"{held['state']} ({escape(held['why'])})"
                                     + ("" if held["state"] == "live" else f"; `{prog()} unlock --host "
                                        f"{escape(name)}` shows and removes it"))
    return exit_code(out.kind if not out.ok else ("ok" if row.ok else "drift") for row, out in zip(rows, outcomes))


def _router_columns(target: Target, rows) -> None:
    """With a [router]: each host's state in it (in, drained, absent, unhealthy) and the decode speed the last roll's
    speed gate measured on it."""
    if target.inventory.router is None:
        return
    from gpufleet.cli.router_roll import status_client
    from gpufleet.fleet import router_status
    from gpufleet.fleet.roll import runs_dir
    from gpufleet.cli.fleetdir import fleet_dir

    runs = runs_dir(fleet_dir() / "runs")
    extra = {"router": router_status.router_cells(status_client(target), target.hosts, target.stacks, runs),
             "speed": router_status.speed_cells(target.hosts, runs)}
    for row in rows:
        for key, cells in extra.items():
            if row.reachable and row.host in cells:
                row.cells[key] = cells[row.host]
