"""Requests in flight on a host's SGLang server, read the way the server itself reports them.

Upstream (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py): `GET /get_load` answers one entry per
data-parallel rank, `[{"dp_rank": 0, "num_reqs": N, "num_waiting_reqs": W, "num_tokens": T, ...}]`, where num_reqs
counts running and waiting requests (later versions keep /get_load as a shim over /v1/loads with the same fields).
A server without it (404) is read through `GET /metrics` (needs --enable-metrics): the gauges
`sglang:num_running_reqs` and `sglang:num_queue_reqs` (srt/metrics/collector.py), summed over their label sets.
"""

from __future__ import annotations

import re

from gpufleet.errors import GpufleetError
from gpufleet.fleet import health

_SAMPLE = re.compile(r"^(sglang:num_running_reqs|sglang:num_queue_reqs)(\{[^}]*\})?\s+([0-9.eE+-]+)\s*$")


class LoadUnknown(GpufleetError):
    """The server reports no load this tool can read."""


def parse_get_load(data) -> int:
    """Requests in flight from /get_load's answer (a list per DP rank, or one such dict)."""
    ranks = data if isinstance(data, list) else [data]
    total = 0
    for rank in ranks:
        if not isinstance(rank, dict) or not isinstance(rank.get("num_reqs"), (int, float)):
            raise LoadUnknown(f"/get_load answered without num_reqs: {str(data)[:200]}")
        total += int(rank["num_reqs"])
    return total


def parse_metrics(text: str) -> int:
    """Running + queued requests from Prometheus text; LoadUnknown when neither gauge is there."""
    found, total = False, 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m:
            found, total = True, total + float(m.group(3))
    if not found:
        raise LoadUnknown("/metrics has no sglang:num_running_reqs (start the server with --enable-metrics)")
    return int(round(total))


def in_flight(session, port: int, address: str = "127.0.0.1") -> int:
    """Requests the host's server is working on now (running + waiting), as seen from the host."""
    try:
        resp = health.request(session, port, "GET", "/get_load", address=address)
        if resp.status == 200:
            return parse_get_load(resp.json())
        resp = health.request(session, port, "GET", "/metrics", address=address)
    except health._REQUEST_ERRORS as exc:
        raise LoadUnknown(f"host {session.name}: reading the server's load: {health._why(exc)}") from None
    except ValueError as exc:
        raise LoadUnknown(f"host {session.name}: /get_load answered no JSON: {exc}") from None
    if resp.status != 200:
        raise LoadUnknown(f"host {session.name}: /get_load and /metrics answered HTTP {resp.status}")
    return parse_metrics(resp.body.decode(errors="replace"))
