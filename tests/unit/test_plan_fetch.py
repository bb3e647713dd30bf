"""Pinned wheels by URL: fetched once per run for every host, sha256-checked, reused from the cache dir."""

from __future__ import annotations

import hashlib
import http.server
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpufleet.wheels.download import Retry
from gpufleet.wheels.fetch import FetchError, WheelCache, wheel_filename

BODY = b"pretend this is a 2 GB wheel"
SHA = hashlib.sha256(BODY).hexdigest()
NAME = "flashinfer_jit_cache-0.6.5+cu130-cp39-abi3-manylinux_2_28_x86_64.whl"


@pytest.fixture
def server():
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v0.6.5/{NAME.replace('+', '%2B')}", hits
    finally:
        httpd.shutdown()


def test_wheel_filename_is_unquoted_from_the_url():
    assert wheel_filename("https://x/releases/v0.6.5/" + NAME.replace("+", "%2B")) == NAME
    with pytest.raises(FetchError, match="does not name a .whl"):
        wheel_filename("https://x/releases/latest")


def test_eight_hosts_one_download(server, tmp_path):
    url, hits = server
    cache = WheelCache(tmp_path)
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: cache.get(url, SHA), range(8)))
    assert len(hits) == 1 and cache.downloads == [url]
    assert {p.read_bytes() for p in paths} == {BODY}
    assert paths[0] == tmp_path / SHA / NAME


def test_cached_file_is_reused_by_the_next_run(server, tmp_path):
    url, hits = server
    WheelCache(tmp_path).get(url, SHA)
    again = WheelCache(tmp_path)
    assert again.get(url, SHA).read_bytes() == BODY
    assert len(hits) == 1 and again.downloads == []


def test_wrong_sha256_is_refused_once_for_all_hosts(server, tmp_path):
    url, hits = server
    cache = WheelCache(tmp_path)
    for _ in range(3):
        with pytest.raises(FetchError, match="stack.toml pins " + "0" * 64):
            cache.get(url, "0" * 64)
    assert len(hits) == 1
    assert not list(tmp_path.rglob("*.whl")) and not list(tmp_path.rglob("*.part"))


def test_file_url_is_checked_not_copied(tmp_path):
    wheel = tmp_path / NAME
    wheel.write_bytes(BODY)
    assert WheelCache(tmp_path / "cache").get(wheel.as_uri(), SHA) == wheel
    with pytest.raises(FetchError, match="sha256 is"):
        WheelCache(tmp_path / "cache").get(wheel.as_uri(), "1" * 64)


def test_unreachable_url_is_a_clear_error(tmp_path):
    with pytest.raises(FetchError, match="cannot download http://127.0.0.1:9/"):
        WheelCache(tmp_path, retry=Retry(attempts=2, backoff=0)).get(f"http://127.0.0.1:9/{NAME}", SHA)
