"""A roll's router and speed gate, set up from its Target: the hooks RollProcedures calls (gpufleet/fleet/drain.py)."""

from __future__ import annotations

import atexit

from gpufleet.engine.runner import session_for
from gpufleet.fleet import router as router_api
from gpufleet.fleet.drain import RollHooks


def hooks_for(target, summary, record, say) -> RollHooks:
    """Hooks for this roll; with a [router], the router is asked for its workers now, so an unreachable router or a
    wrong API key stops the roll before any host is touched."""
    cfg = target.inventory.router
    client = None
    if cfg is not None:
        client = router_api.client(cfg, _via_session(target))
        workers = client.workers()
        say(f"router {cfg.admin_url} ({router_api.API_VERSION} API{', via ' + cfg.via if cfg.via else ''}): "
            f"{len(workers)} worker(s), {sum(w.healthy for w in workers)} healthy")
    previous_out = list(target.resumed.summary.out_of_router) if target.resumed else []
    summary.out_of_router = list(previous_out)  # still out until this roll puts them back
    return RollHooks(stacks=target.stacks, router_cfg=cfg, client=client, summary=summary, record=record,
                     speed_gate=not target.roll.no_speed_gate, drain_timeout=target.roll.drain_timeout,
                     on_drain_timeout=target.roll.on_drain_timeout, say=say, previous_out=previous_out)


def _via_session(target):
    """Opens the SSH connection to [router] via once, for the whole roll (closed when the process ends)."""
    opened = {}

    def open_session(name: str):
        if name not in opened:
            session = session_for(target.inventory.hosts[name], target.inventory, target.hidden)
            session.__enter__()
            atexit.register(session.close)
            opened[name] = session
        return opened[name]
    return open_session


def status_client(target) -> router_api.RouterClient:
    """The router client for `inv status` (through [router] via when set)."""
    return router_api.client(target.inventory.router, _via_session(target))
