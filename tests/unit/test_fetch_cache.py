"""The control node's wheel cache: unpinned wheels, cached files gone bad, and gpufleet's own pip wheel."""

from __future__ import annotations

import hashlib
import http.server
import subprocess
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpufleet.wheels.download import Retry
from gpufleet.wheels.fetch import FetchError, WheelCache, fetch_pip_wheel, sha256_of

BODY = b"pretend this is a wheel from an index without hashes"
SHA = hashlib.sha256(BODY).hexdigest()
NAME = "triton-3.6.0-py3-none-any.whl"
PIP = "26.3"


@pytest.fixture
def server():
    """An HTTP server on loopback serving `served[0]` for every path; records each GET."""
    hits, served = [], [BODY]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            body = served[0]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/files/{NAME}", hits, served
    finally:
        httpd.shutdown()


# --- unpinned wheels (the index published no hash) -------------------------------------------------------------

def test_unpinned_wheel_lands_under_its_sha256_and_is_fetched_once(server, tmp_path: Path) -> None:
    url, hits, _ = server
    cache = WheelCache(tmp_path)
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: cache.get(url, None), range(4)))
    assert len(hits) == 1 and cache.downloads == [url]
    assert set(paths) == {tmp_path / SHA / NAME}
    assert paths[0].read_bytes() == BODY
    assert cache.sha256(paths[0]) == SHA
    assert not list(tmp_path.rglob("*.part"))
    assert not [p for p in (tmp_path / "unpinned").rglob("*") if p.is_file()]


def test_unpinned_wheel_is_fetched_again_by_the_next_run(server, tmp_path: Path) -> None:
    # without a pin nothing says the cached copy is still what the index serves
    url, hits, served = server
    assert WheelCache(tmp_path).get(url, None) == tmp_path / SHA / NAME
    served[0] = b"the index now serves another file under the same name"
    again = WheelCache(tmp_path)
    path = again.get(url, None)
    new_sha = hashlib.sha256(served[0]).hexdigest()
    assert path == tmp_path / new_sha / NAME and path.read_bytes() == served[0]
    assert again.sha256(path) == new_sha and len(hits) == 2 and again.downloads == [url]


def test_sha256_of_a_file_outside_the_cache_is_computed(tmp_path: Path) -> None:
    cache = WheelCache(tmp_path / "cache")
    # a directory named like a sha256 but not in this cache proves nothing
    elsewhere = tmp_path / ("0" * 64) / NAME
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(BODY)
    assert cache.sha256(elsewhere) == SHA == sha256_of(elsewhere)


def test_unpinned_failure_is_remembered_for_every_host(tmp_path: Path) -> None:
    cache = WheelCache(tmp_path, retry=Retry(attempts=2, backoff=0))
    url = f"http://127.0.0.1:9/files/{NAME}"
    for _ in range(2):
        with pytest.raises(FetchError, match="cannot download http://127.0.0.1:9/"):
            cache.get(url, None)
    assert cache.downloads == []


# --- pinned wheels whose cached copy went bad ------------------------------------------------------------------

def test_a_corrupted_cached_file_is_fetched_again(server, tmp_path: Path) -> None:
    url, hits, _ = server
    path = WheelCache(tmp_path).get(url, SHA)
    path.write_bytes(b"truncated")
    again = WheelCache(tmp_path)
    assert again.get(url, SHA) == path
    assert path.read_bytes() == BODY
    assert len(hits) == 2 and again.downloads == [url]


def test_a_corrupted_cached_file_that_the_index_also_serves_wrong_is_refused(server, tmp_path: Path) -> None:
    url, hits, served = server
    path = WheelCache(tmp_path).get(url, SHA)
    path.write_bytes(b"truncated")
    served[0] = b"something else entirely"
    with pytest.raises(FetchError, match=f"downloaded sha256 is {hashlib.sha256(served[0]).hexdigest()}"):
        WheelCache(tmp_path).get(url, SHA)
    assert len(hits) == 2 and path.read_bytes() == b"truncated"


def test_the_pin_is_compared_in_lower_case(server, tmp_path: Path) -> None:
    url, hits, _ = server
    assert WheelCache(tmp_path).get(url, SHA.upper()) == tmp_path / SHA / NAME
    assert len(hits) == 1


# --- gpufleet's pip wheel --------------------------------------------------------------------------------------

def pip_wheel_at(root: Path) -> Path:
    return root / "tools" / f"pip-{PIP}-py3-none-any.whl"


def write_wheel(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pip/__init__.py", "__version__ = '26.3'\n")
    return path


def test_a_valid_pip_wheel_is_reused_without_pip(mocker, tmp_path: Path) -> None:
    wheel = write_wheel(pip_wheel_at(tmp_path))
    run = mocker.patch("subprocess.run")
    assert fetch_pip_wheel(PIP, "https://pypi.org/simple", root=tmp_path) == wheel
    run.assert_not_called()


def test_a_corrupt_pip_wheel_is_deleted_and_downloaded_again(mocker, tmp_path: Path) -> None:
    wheel = pip_wheel_at(tmp_path)
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"not a zip at all")
    seen = []

    def download(cmd, **kw):
        seen.append((cmd, wheel.exists()))
        write_wheel(wheel)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    run = mocker.patch("subprocess.run", side_effect=download)
    assert fetch_pip_wheel(PIP, "http://10.213.0.1:8765/simple", ["10.213.0.1"], root=tmp_path) == wheel
    run.assert_called_once()
    [(cmd, existed)] = seen
    assert not existed  # the broken copy was gone before pip ran
    assert cmd[1:4] == ["-m", "pip", "download"] and f"pip=={PIP}" in cmd and "--no-deps" in cmd
    assert cmd[cmd.index("--dest") + 1] == str(wheel.parent)
    assert cmd[cmd.index("--index-url") + 1] == "http://10.213.0.1:8765/simple"
    assert cmd[cmd.index("--trusted-host") + 1] == "10.213.0.1"
    env = run.call_args.kwargs["env"]
    assert env["PIP_CONFIG_FILE"] and env["PIP_DISABLE_PIP_VERSION_CHECK"] == "1"
    with zipfile.ZipFile(wheel) as archive:
        assert archive.testzip() is None


def test_a_pip_wheel_with_a_bad_member_is_downloaded_again(mocker, tmp_path: Path) -> None:
    wheel = write_wheel(pip_wheel_at(tmp_path))
    data = bytearray(wheel.read_bytes())
    at = data.index(b"__version__")
    data[at] = ord("X")  # stored, not compressed: the member's CRC no longer matches
    wheel.write_bytes(bytes(data))

    run = mocker.patch("subprocess.run", side_effect=lambda cmd, **kw: (
        write_wheel(wheel), subprocess.CompletedProcess(cmd, 0, "", ""))[1])
    assert fetch_pip_wheel(PIP, "https://pypi.org/simple", root=tmp_path) == wheel
    run.assert_called_once()


def test_a_failing_pip_download_is_a_fetch_error_with_pips_words(mocker, tmp_path: Path) -> None:
    stderr = "x" * 2000 + "\nERROR: No matching distribution found for pip==26.3\n"
    mocker.patch("subprocess.run", return_value=subprocess.CompletedProcess([], 1, "", stderr))
    with pytest.raises(FetchError) as info:
        fetch_pip_wheel(PIP, "https://user:secret@pypi.example/simple", root=tmp_path)
    text = str(info.value)
    assert "cannot download pip 26.3 from" in text and "the resolver gpufleet runs on hosts" in text
    assert text.endswith("ERROR: No matching distribution found for pip==26.3")
    assert "x" * 601 not in text  # only the tail
    assert "secret" not in text


def test_pip_that_succeeds_without_writing_the_wheel_is_a_fetch_error(mocker, tmp_path: Path) -> None:
    mocker.patch("subprocess.run", return_value=subprocess.CompletedProcess([], 0, "Saved pip-26.2.whl\n", ""))
    with pytest.raises(FetchError, match="Saved pip-26.2.whl"):
        fetch_pip_wheel(PIP, "https://pypi.org/simple", root=tmp_path)
