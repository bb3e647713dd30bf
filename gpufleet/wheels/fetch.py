"""Wheels pinned by URL and sha256: fetched at most once per run into a local cache dir, checked, reused."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

from gpufleet.kernel import sources
from gpufleet.wheels import download
from gpufleet.cachedir import cache_root
from gpufleet.errors import GpufleetError
from gpufleet.facts.checkout import redact_url

CHUNK = 1 << 20


class FetchError(GpufleetError):
    """A pinned wheel could not be fetched, or its sha256 is not the pinned one."""


def default_cache_dir() -> Path:
    return cache_root() / "wheels"


def wheel_filename(url: str) -> str:
    """The wheel's file name from its URL (pip needs the real name to read tags and version)."""
    name = unquote(urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1])
    if not name.endswith(".whl") or "/" in name:
        raise FetchError(f"{redact_url(url)}: does not name a .whl file")
    return name


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class WheelCache:
    """One per run, shared by the host threads: each URL is fetched (or its cached copy checked) only once."""

    def __init__(self, root: Path | None = None, *, progress: download.Progress | None = None,
                 retry: download.Retry = download.Retry()):
        self.root = Path(root) if root else default_cache_dir()
        self.progress = progress  # told of each download's bytes (a bar on a terminal, lines in a roll)
        self.retry = retry
        self.downloads: list[str] = []  # URLs fetched over the network during this run
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._done: dict[str, Path | FetchError] = {}

    def get(self, url: str, sha256: str | None) -> Path:
        """A local file with the pinned content; a failure is remembered so other hosts do not retry it.
        Without a pin (an index that publishes no hashes) the file is fetched once per run and hashed here."""
        with self._guard:
            lock = self._locks.setdefault(url, threading.Lock())
        with lock:
            if url not in self._done:
                try:
                    self._done[url] = (self._obtain(url, sha256.lower()) if sha256 else self._unpinned(url))
                except FetchError as exc:
                    self._done[url] = exc
            found = self._done[url]
        if isinstance(found, FetchError):
            raise found
        return found

    def sha256(self, path: Path) -> str:
        """The sha256 of a file this cache handed out (its directory is named by it)."""
        return path.parent.name if path.parent.parent == self.root else sha256_of(path)

    def _unpinned(self, url: str) -> Path:
        if sources.is_git_url(url):  # a build's FetchContent dependency: the tree of repository@tag as a tar
            try:
                return self._hashed(sources.fetch_archive(url, self.root.parent / "sources"))
            except sources.SourceError as exc:
                raise FetchError(str(exc)) from None
        tmp = self.root / "unpinned" / hashlib.sha256(url.encode()).hexdigest() / wheel_filename(url)
        self._download(url, tmp, None)
        path = self.root / sha256_of(tmp) / tmp.name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
        return path

    def _hashed(self, path: Path) -> Path:
        """A copy of path under <sha256>/ (hard-linked where possible), so sha256() reads its name."""
        target = self.root / sha256_of(path) / path.name
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(target.name + ".part")
            part.unlink(missing_ok=True)
            try:
                os.link(path, part)
            except OSError:
                import shutil

                shutil.copyfile(path, part)
            os.replace(part, target)
        return target

    def _obtain(self, url: str, sha256: str) -> Path:
        parts = urlsplit(url)
        if parts.scheme == "file":
            path = Path(unquote(parts.path))
            if not path.is_file():
                raise FetchError(f"{redact_url(url)}: no such file")
            self._check(url, path, sha256)
            return path
        path = self.root / sha256 / wheel_filename(url)
        if path.is_file() and sha256_of(path) == sha256:
            return path
        self._download(url, path, sha256)
        return path

    @staticmethod
    def _check(url: str, path: Path, sha256: str) -> None:
        got = sha256_of(path)
        if got != sha256:
            raise FetchError(f"{redact_url(url)}: sha256 is {got}, stack.toml pins {sha256}: refusing the wheel")

    def _download(self, url: str, path: Path, sha256: str | None) -> None:
        fetched = path.with_name(path.name + ".fetched")  # replaces a cached copy only once its hash is right
        try:
            download.download(url, fetched, retry=self.retry, progress=self.progress)
        except download.DownloadError as exc:
            raise FetchError(str(exc)) from None
        self.downloads.append(url)
        if sha256 is not None and (got := sha256_of(fetched)) != sha256:
            fetched.unlink(missing_ok=True)
            raise FetchError(f"{redact_url(url)}: downloaded sha256 is {got}, stack.toml pins {sha256}: "
                             f"refusing the wheel")
        os.replace(fetched, path)


def fetch_pip_wheel(version: str, index_url: str, trusted_hosts=(), root: Path | None = None) -> Path:
    """pip's own wheel at `version`, downloaded once into the control node's cache (a broken copy is refetched):
    the resolver and installer gpufleet runs on every host."""
    import subprocess
    import sys
    import zipfile

    dest = (root or cache_root()) / "tools"
    wheel = dest / f"pip-{version}-py3-none-any.whl"
    if wheel.is_file():
        try:
            with zipfile.ZipFile(wheel) as archive:
                if archive.testzip() is None:
                    return wheel
        except zipfile.BadZipFile:
            pass
        wheel.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest",
           str(dest), f"pip=={version}", "--index-url", index_url]
    for host in trusted_hosts:
        cmd += ["--trusted-host", host]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0 or not wheel.is_file():
        raise FetchError(f"cannot download pip {version} from {redact_url(index_url)} (the resolver gpufleet runs "
                         f"on hosts): {(proc.stderr or proc.stdout).strip()[-600:]}")
    return wheel
