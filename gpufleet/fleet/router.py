"""The SGLang router's worker API (sglang-router 0.3.2, the SGLang Model Gateway): list, add, remove, health.

API as the installed sglang-router 0.3.2 serves it (read from its README and checked against the real binary; the
Rust sources are sgl-project/sglang `sgl-model-gateway/src/`):
  GET    /workers              -> {"workers": [{"id", "url", "model_id", "is_healthy", "load", ...}], "total", ...}
  POST   /workers {"url": ...} -> 202 {"status": "accepted", "worker_id": UUID, ...}: a background job; the worker
                                  appears in the list once the router has reached its /health, /server_info and
                                  /model_info (core/steps/worker/local/discover_metadata.rs); a job for a worker
                                  already listed fails ("already exists"), the listed one stays
  DELETE /workers/{id}         -> 202 {"status": "accepted", ...}: removal, also a background job
  GET    /workers/{id}         -> the worker with "job_status" (AddWorker/RemoveWorker: pending|processing|failed)
  GET    /health               -> the router's own liveness
Every admin route wants `Authorization: Bearer <key>` when the router runs with --api-key (or a control-plane key).
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

from gpufleet.errors import GpufleetError
from gpufleet.fleet import health

API_VERSION = "sglang-router 0.3.2"
REQUEST_TIMEOUT = 15.0
POLL = 0.5  # seconds between reads of the worker list while a job finishes


class RouterError(GpufleetError):
    """The router could not be reached or refused a request; names the router, the request and its answer."""


@dataclass(frozen=True)
class Worker:
    """One worker as the router lists it."""

    id: str
    url: str
    model_id: str
    healthy: bool
    load: int = 0

    @classmethod
    def of(cls, data: dict) -> "Worker":
        return cls(str(data.get("id", "")), str(data.get("url", "")).rstrip("/"), str(data.get("model_id") or ""),
                   bool(data.get("is_healthy")), int(data.get("load") or 0))


@dataclass
class Answer:
    status: int
    body: bytes

    def json(self):
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None


def direct(admin_url: str) -> Callable[[str, str, dict, bytes, float], Answer]:
    """A transport straight from the control node to the router."""
    parts = urlsplit(admin_url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection

    def send(method: str, path: str, headers: dict, body: bytes, timeout: float) -> Answer:
        conn = cls(parts.hostname, parts.port, timeout=timeout)
        try:
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            return Answer(resp.status, resp.read())
        finally:
            conn.close()
    return send


def tunnelled(session, admin_url: str) -> Callable[[str, str, dict, bytes, float], Answer]:
    """A transport through a direct-tcpip channel of an inventory host's SSH connection (the admin URL as that host
    sees it); plain http only (a TLS router is reached directly)."""
    parts = urlsplit(admin_url)
    if parts.scheme != "http":
        raise RouterError(f"router {admin_url}: only an http:// admin URL can be reached through an SSH tunnel")
    port = parts.port or 80

    def send(method: str, path: str, headers: dict, body: bytes, timeout: float) -> Answer:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close",
                 *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {len(body)}"]
        chan = session.tunnel(port, parts.hostname, timeout=timeout)
        try:
            chan.settimeout(timeout)
            chan.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
            data = b""
            while True:
                chunk = chan.recv(65536)
                done = health.parse_response(data + chunk, eof=not chunk)
                data += chunk
                if done is not None:
                    return Answer(done.status, done.body)
        finally:
            chan.close()
    return send


class RouterClient:
    """The router's worker API; every failure is a RouterError naming the router, request, status and answer."""

    def __init__(self, admin_url: str, send, api_key: str | None = None, *, clock=time.monotonic,
                 sleep=time.sleep):
        self.admin_url, self.send, self.api_key = admin_url, send, api_key
        self.clock, self.sleep = clock, sleep

    def _call(self, method: str, path: str, payload: dict | None = None, ok=(200,)) -> Answer:
        headers = {"Accept": "application/json", "User-Agent": "gpufleet"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body = b"" if payload is None else json.dumps(payload).encode()
        try:
            answer = self.send(method, path, headers, body, REQUEST_TIMEOUT)
        except (OSError, EOFError, GpufleetError, http.client.HTTPException) as exc:
            raise RouterError(f"router {self.admin_url}: {method} {path}: {exc or type(exc).__name__}") from None
        except Exception as exc:  # paramiko's channel errors (the tunnel's host refused the port)
            raise RouterError(f"router {self.admin_url}: {method} {path}: {type(exc).__name__}: {exc}") from None
        if answer.status not in ok:
            text = answer.body[:300].decode(errors="replace")
            hint = " (set [router] api_key_file or api_key_env)" if answer.status in (401, 403) else ""
            raise RouterError(f"router {self.admin_url}: {method} {path} answered HTTP {answer.status}{hint}: {text}")
        return answer

    def alive(self) -> bool:
        """The router's own /health answers 200."""
        try:
            return self._call("GET", "/health").status == 200
        except RouterError:
            return False

    def workers(self) -> list[Worker]:
        data = self._call("GET", "/workers").json()
        if not isinstance(data, dict) or not isinstance(data.get("workers"), list):
            raise RouterError(f"router {self.admin_url}: GET /workers: not a worker list: {str(data)[:200]}")
        return [Worker.of(w) for w in data["workers"] if isinstance(w, dict)]

    def find(self, url: str) -> Worker | None:
        url = url.rstrip("/")
        return next((w for w in self.workers() if w.url == url), None)

    def add(self, url: str) -> str:
        """Queue the worker's registration; its id (the job's)."""
        data = self._call("POST", "/workers", {"url": url}, ok=(200, 201, 202)).json() or {}
        return str(data.get("worker_id", ""))

    def remove(self, worker: Worker) -> None:
        self._call("DELETE", f"/workers/{worker.id}", ok=(200, 202, 204))

    def job(self, worker_id: str) -> dict:
        """The router's record of a worker or its queued job ({} when it has none)."""
        try:
            data = self._call("GET", f"/workers/{worker_id}").json()
        except RouterError:
            return {}
        return data if isinstance(data, dict) else {}

    def wait_gone(self, url: str, timeout: float) -> float:
        """Wait until the router no longer lists url; the seconds it took."""
        start = self.clock()
        while self.find(url) is not None:
            if self.clock() - start > timeout:
                raise RouterError(f"router {self.admin_url}: {url} still listed {timeout:.0f}s after its removal")
            self.sleep(POLL)
        return self.clock() - start

    def wait_healthy(self, url: str, timeout: float, worker_id: str = "") -> float:
        """Wait until the router lists url as healthy; the seconds it took. A failed add job ends the wait early."""
        start = self.clock()
        while True:
            found = self.find(url)
            if found is not None and found.healthy:
                return self.clock() - start
            status = (self.job(worker_id).get("job_status") or {}) if worker_id and found is None else {}
            if status.get("status") == "failed":
                raise RouterError(f"router {self.admin_url}: adding {url} failed: {status.get('message')}")
            if self.clock() - start > timeout:
                state = "listed but unhealthy" if found else "not listed"
                raise RouterError(f"router {self.admin_url}: {url} not healthy in the router after {timeout:.0f}s "
                                  f"({state})")
            self.sleep(POLL)


def client(router, open_session: Callable[[str], object] | None = None) -> RouterClient:
    """The client for an inventory's [router]: direct, or through an SSH tunnel over router.via (open_session(name)
    gives that host's connected session)."""
    if router.via is None:
        return RouterClient(router.admin_url, direct(router.admin_url), router.api_key)
    if open_session is None:
        raise RouterError(f"router {router.admin_url}: reached through {router.via}, but no SSH session is open")
    return RouterClient(router.admin_url, tunnelled(open_session(router.via), router.admin_url), router.api_key)


def worker_url(host, stack) -> str:
    """The URL the router knows a host's server by: the host's worker_url, else http://<address>:<server port>."""
    if getattr(host, "worker_url", None):
        return host.worker_url.rstrip("/")
    address = f"[{host.address}]" if ":" in host.address else host.address
    return f"http://{address}:{stack.server.port}"
