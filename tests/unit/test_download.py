"""Downloads against a real local HTTP server that fails, cuts streams, honours Range and wants credentials."""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.wheels import download
from gpufleet.wheels.download import DownloadError, Retry
from gpufleet.wheels.fetch import FetchError, WheelCache

BODY = bytes(range(256)) * 4096  # 1 MiB
NAME = "flashinfer_jit_cache-0.6.5+cu130-cp39-abi3-manylinux_2_28_x86_64.whl"
NO_WAIT = Retry(attempts=4, backoff=0)


@dataclass
class Behaviour:
    """What the server does: fail the first `busy` requests, cut the first `cuts` bodies halfway, want a login."""
    busy: int = 0
    cuts: int = 0
    login: tuple[str, str] | None = None
    ranges: bool = True
    status: int = 200
    requests: list[dict] = field(default_factory=list)


@pytest.fixture
def server():
    how = Behaviour()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            how.requests.append({"path": self.path, "range": self.headers.get("Range"),
                                 "auth": self.headers.get("Authorization")})
            if how.login:
                token = base64.b64encode(":".join(how.login).encode()).decode()
                if self.headers.get("Authorization") != f"Basic {token}":
                    self.send_error(401)
                    return
            if how.status != 200:
                self.send_error(how.status)
                return
            if how.busy:
                how.busy -= 1
                self.send_error(503)
                return
            start = 0
            wanted = self.headers.get("Range")
            if wanted and how.ranges:
                start = int(wanted.removeprefix("bytes=").rstrip("-"))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(BODY) - 1}/{len(BODY)}")
            else:
                self.send_response(200)
            body = BODY[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if how.cuts:
                how.cuts -= 1
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}", how
    finally:
        httpd.shutdown()


def _url(address: str, creds: str = "") -> str:
    return f"http://{creds}{address}/whl/{NAME.replace('+', '%2B')}"


def test_busy_server_is_retried_with_growing_waits(server, tmp_path: Path) -> None:
    address, how = server
    how.busy = 2
    waits: list[float] = []
    attempts = download.download(_url(address), tmp_path / NAME, retry=Retry(attempts=4, backoff=0.5),
                                 sleep=waits.append)
    assert attempts == 3 and waits == [0.5, 1.0]
    assert (tmp_path / NAME).read_bytes() == BODY


def test_a_cut_stream_resumes_from_what_arrived(server, tmp_path: Path) -> None:
    address, how = server
    how.cuts = 1
    seen: list[tuple[int, int | None]] = []
    download.download(_url(address), tmp_path / NAME, retry=NO_WAIT, progress=lambda u, d, t: seen.append((d, t)))
    assert (tmp_path / NAME).read_bytes() == BODY
    assert [r["range"] for r in how.requests] == [None, f"bytes={len(BODY) // 2}-"]
    assert seen[-1] == (len(BODY), len(BODY))
    assert not (tmp_path / (NAME + ".part")).exists()


def test_a_part_left_by_a_killed_run_is_resumed(server, tmp_path: Path) -> None:
    address, how = server
    (tmp_path / (NAME + ".part")).write_bytes(BODY[:1000])
    download.download(_url(address), tmp_path / NAME, retry=NO_WAIT)
    assert how.requests[0]["range"] == "bytes=1000-"
    assert (tmp_path / NAME).read_bytes() == BODY


def test_a_server_without_ranges_sends_it_all_again(server, tmp_path: Path) -> None:
    address, how = server
    how.ranges = False
    (tmp_path / (NAME + ".part")).write_bytes(b"x" * 1000)
    download.download(_url(address), tmp_path / NAME, retry=NO_WAIT)
    assert (tmp_path / NAME).read_bytes() == BODY


def test_a_missing_file_is_not_retried(server, tmp_path: Path) -> None:
    address, how = server
    how.status = 404
    with pytest.raises(DownloadError, match="HTTP 404"):
        download.download(_url(address), tmp_path / NAME, retry=NO_WAIT)
    assert len(how.requests) == 1


def test_giving_up_names_the_url_the_attempts_and_keeps_the_part(server, tmp_path: Path) -> None:
    address, how = server
    how.cuts = 10
    with pytest.raises(DownloadError) as info:
        download.download(_url(address, "ops:s3cret@"), tmp_path / NAME, retry=Retry(attempts=2, backoff=0))
    text = str(info.value)
    assert "4 attempts" not in text and "2 attempts" in text and "s3cret" not in text and "ops" not in text
    assert (tmp_path / (NAME + ".part")).stat().st_size > 0


def test_credentials_in_the_url_become_a_header_and_never_show(server, tmp_path: Path) -> None:
    address, how = server
    how.login = ("ops", "p@ss:word")
    download.download(_url(address, "ops:p%40ss%3Aword@"), tmp_path / NAME, retry=NO_WAIT)
    assert (tmp_path / NAME).read_bytes() == BODY
    assert how.requests[0]["path"].startswith("/whl/")


def test_credentials_from_netrc(server, tmp_path: Path) -> None:
    address, how = server
    how.login = ("ops", "tok")
    rc = tmp_path / "netrc"
    rc.write_text("machine 127.0.0.1 login ops password tok\n")
    download.download(_url(address), tmp_path / NAME, retry=NO_WAIT, netrc_file=str(rc))
    assert (tmp_path / NAME).read_bytes() == BODY


def test_wrong_credentials_are_one_clear_error_without_the_secret(server, tmp_path: Path) -> None:
    address, how = server
    how.login = ("ops", "right")
    with pytest.raises(DownloadError) as info:
        download.download(_url(address, "ops:wrong@"), tmp_path / NAME, retry=NO_WAIT)
    assert "HTTP 401" in str(info.value) and "wrong" not in str(info.value)


def test_wheel_cache_uses_the_resuming_download_and_checks_the_pin(server, tmp_path: Path) -> None:
    address, how = server
    how.cuts = 1
    cache = WheelCache(tmp_path / "cache", retry=NO_WAIT)
    got = cache.get(_url(address), hashlib.sha256(BODY).hexdigest())
    assert got.read_bytes() == BODY and cache.downloads == [_url(address)]
    with pytest.raises(FetchError, match="refusing the wheel"):
        WheelCache(tmp_path / "other", retry=NO_WAIT).get(_url(address), "0" * 64)
