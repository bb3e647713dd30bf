"""Render the inventory of the simulated fleet (hosts/sim.toml)."""

from __future__ import annotations

import json

from gpufleet.sim.layout import CHECKOUT, CONTROL_ADDR, GITHUB_ADDR, GITHUB_PORT, MODEL_PATH, VENV


def _q(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def render_inventory(fleet, hosts: list, *, known_hosts: str | None = None, connect_timeout: int = 10) -> str:
    """TOML text for hosts (gpufleet.sim.fleet's SimHost: name, address) of fleet (its SimFleet: index_url,
    upstream_url, known_hosts, client_key); package sources point at the control node's index and git daemon."""
    idx = _q(fleet.index_url)
    lines = [
        "# Written by `inv sim.up`: the simulated Blackwell fleet on this machine. Removed by `inv sim.down`.",
        "[settings]",
        f"known_hosts = {_q(known_hosts or str(fleet.known_hosts))}",
        f"connect_timeout = {connect_timeout}",
        "",
        "[defaults]",
        'user = "root"',
        "port = 22",
        f"identity_file = {_q(str(fleet.client_key))}",
        f"venv = {_q(VENV)}",
        f"sglang_checkout = {_q(CHECKOUT)}",
        'service = "sglang"',
        f"model_path = {_q(MODEL_PATH)}",
        "",
        "[defaults.gpus]",
        "count = 8",
        'compute_capability = "12.0"',
        "",
        "# The simulated hosts reach only the control node: every package source points there.",
        "[defaults.stack.torch]",
        f"index_url = {idx}",
        "[defaults.stack.flashinfer.python]",
        f"index_url = {idx}",
        "[defaults.stack.flashinfer.cubin]",
        f"index_url = {idx}",
        "[defaults.stack.flashinfer.jit_cache]",
        f"index_url = {idx}",
        "# stack.toml pins a real upstream commit the simulated upstream cannot have: follow its main instead.",
        "[defaults.stack.sglang]",
        f"remote = {_q(fleet.upstream_url)}",
        'commit = "latest"',
        "# FetchContent sources (github.com) are fetched by the control node from the stand-in GitHub on loopback.",
        "[defaults.stack.sgl_kernel]",
        f'source_mirrors = {{"https://github.com/" = {_q(f"git://{GITHUB_ADDR}:{GITHUB_PORT}/")}}}',
        "[defaults.stack.pip]",
        f"index_url = {idx}",
        f"trusted_hosts = [{_q(CONTROL_ADDR)}]",
        "",
        "[groups]",
        f"canary = [{_q(hosts[0].name)}]" if hosts else "canary = []",
        f"sim = [{', '.join(_q(h.name) for h in hosts)}]",
        "",
    ]
    for host in hosts:
        lines += [f"[hosts.{host.name}]", f"address = {_q(host.address)}", ""]
    return "\n".join(lines)
