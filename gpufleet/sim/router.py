"""The real SGLang router (sglang-router from PyPI, pinned) on the simulated fleet's control node.

scripts/bootstrap installs sglang-router==ROUTER_VERSION into its own virtual environment (.venv-router beside the
checkout; $GPUFLEET_ROUTER_VENV elsewhere): it brings fastapi/uvicorn/aiohttp that gpufleet itself does not need.
The router binds the fleet's bridge address (one fleet's router never answers another's) and routes to the
simulated hosts' stand-in servers, which serve what it reads from a worker (/health, /server_info, /model_info).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from gpufleet.sim import system
from gpufleet.sim.layout import CONTROL_ADDR, RUN_DIR

ROUTER_VERSION = "0.3.2"
ROUTER_PORT = 30080  # on the bridge address, so fleets on one machine never share it
METRICS_PORT = 29080  # the router's Prometheus port (its default, 29000 on 0.0.0.0, would collide across fleets)
MARKER = "router"  # its command line: sglang-router, then sglang::router (it sets its process title)
REPO = Path(__file__).resolve().parents[2]


def find_router() -> list[str] | None:
    """The argv that runs the installed router's CLI, or None: $GPUFLEET_ROUTER_BIN, the bootstrap's
    .venv-router ($GPUFLEET_ROUTER_VENV), then sglang-router on PATH."""
    given = os.environ.get("GPUFLEET_ROUTER_BIN")
    if given:
        return [given] if Path(given).is_file() else None
    venv = Path(os.environ.get("GPUFLEET_ROUTER_VENV") or REPO / ".venv-router")
    for candidate in (venv / "bin" / "sglang-router", shutil.which("sglang-router")):
        if candidate and Path(candidate).is_file():
            return [str(candidate)]
    return None


def installed_version(argv: list[str]) -> str | None:
    """The version of the router package beside the CLI (its venv's metadata)."""
    python = Path(argv[0]).parent / "python"
    if not python.exists():
        return None
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('sglang-router'))"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or None


def launch_argv(argv: list[str], host: str, port: int, metrics_port: int, workers: list[str] = ()) -> list[str]:
    """`sglang-router launch` for the test bed: round robin over the workers, health checked every second, and no
    retries (a request that reaches a stopped server must fail visibly, not be retried onto another worker)."""
    return [*argv, "launch", "--host", host, "--port", str(port), "--prometheus-host", host,
            "--prometheus-port", str(metrics_port), "--policy", "round_robin", "--health-check-interval-secs", "1",
            "--health-failure-threshold", "1", "--health-success-threshold", "1", "--disable-retries",
            "--log-level", "warn", *(["--worker-urls", *workers] if workers else [])]


def running(pid: int) -> bool:
    """pid runs and is no zombie (its command line is no guide while it sets its process title)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def wait_ready(url: str, pid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not running(pid):
            raise RuntimeError(f"the router (pid {pid}) exited before answering {url}/health")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the router did not answer {url}/health within {timeout:.0f}s")


class SimRouter:
    """The fleet's router process: started by sim.up when the router is installed, stopped by sim.down."""

    def __init__(self, run_dir: Path = RUN_DIR, address: str = CONTROL_ADDR, port: int = ROUTER_PORT):
        self.run_dir, self.address, self.port = Path(run_dir), address, port
        self.state_path = self.run_dir / "router.json"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def pid(self) -> int:
        try:
            return int(json.loads(self.state_path.read_text()).get("pid", 0))
        except (OSError, ValueError):
            return 0

    def running(self) -> bool:
        return system.pid_alive(self.pid(), MARKER)

    def start(self) -> bool:
        """Start the router unless it runs; False when it is not installed."""
        if self.running():
            return True
        argv = find_router()
        if argv is None:
            return False
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = self.run_dir / "router.log"
        pid = system.spawn_detached(launch_argv(argv, self.address, self.port, METRICS_PORT), log)
        self.state_path.write_text(json.dumps({"pid": pid, "url": self.url}))
        wait_ready(self.url, pid)
        return True

    def stop(self) -> None:
        pid = self.pid()
        if pid:
            system.stop_pid(pid, MARKER, timeout=10)
        self.state_path.unlink(missing_ok=True)
