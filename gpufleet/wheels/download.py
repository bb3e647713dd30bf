"""One HTTP(S) download onto the control node: credentials from the URL or ~/.netrc, retried with backoff, resumed."""

from __future__ import annotations

import base64
import http.client
import netrc
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlsplit, urlunsplit

from gpufleet.errors import GpufleetError
from gpufleet.facts.checkout import redact_url

CHUNK = 1 << 20
# Worth another try: the server or a proxy was busy or cut the stream. A 401/403/404 will not change by waiting.
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})

Progress = Callable[[str, int, "int | None"], None]  # (url without credentials, bytes so far, total or None)


class DownloadError(GpufleetError):
    """A file could not be downloaded; the message names the URL without its credentials."""


@dataclass(frozen=True)
class Retry:
    """How often and how patiently a download is retried (waits: backoff, 2x, 4x, ... up to cap)."""
    attempts: int = 5
    backoff: float = 1.0
    cap: float = 30.0

    def wait(self, attempt: int) -> float:
        return min(self.cap, self.backoff * 2 ** attempt)


def request_for(url: str, netrc_file: str | None = None) -> urllib.request.Request:
    """A request for url with its credentials moved into an Authorization header (urllib never sends URL user
    info); without any in the URL, the netrc entry for its host is used, as pip and curl do."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    if ":" in (parts.hostname or ""):
        netloc = f"[{parts.hostname}]" + (f":{parts.port}" if parts.port else "")
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    if not user and parts.scheme in ("http", "https"):
        user, password = _netrc_login(parts.hostname or "", netrc_file)
    request = urllib.request.Request(clean)
    if user or password:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_unredirected_header("Authorization", f"Basic {token}")
    return request


def _netrc_login(host: str, netrc_file: str | None) -> tuple[str, str]:
    path = netrc_file or os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    if not os.path.isfile(path):
        return "", ""
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (netrc.NetrcParseError, OSError) as exc:
        raise DownloadError(f"{path}: cannot read it for the credentials of {host}: {exc}") from None
    if not entry:
        return "", ""
    login, _, password = entry
    return login or "", password or ""


def download(url: str, dest: Path, *, retry: Retry = Retry(), progress: Progress | None = None,
             timeout: float = 60, netrc_file: str | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Download url into dest; the bytes arrive in dest + '.part', which a cut connection or a killed run leaves for
    the next attempt to resume (HTTP Range). Returns the number of attempts it took."""
    shown = redact_url(url)
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    last = ""
    for attempt in range(retry.attempts):
        if attempt:
            sleep(retry.wait(attempt - 1))
        try:
            if _attempt(url, part, shown, progress, timeout, netrc_file):
                os.replace(part, dest)
                return attempt + 1
            last = "the connection closed before the whole file arrived"
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and part.exists():  # our part is not a prefix of what the server has: start over
                part.unlink()
                last = "HTTP 416 for the resumed range"
                continue
            if exc.code not in RETRY_STATUS:
                raise DownloadError(f"cannot download {shown}: HTTP {exc.code} {exc.reason}") from None
            last = f"HTTP {exc.code} {exc.reason}"
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            last = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
    raise DownloadError(f"cannot download {shown}: {last} ({retry.attempts} attempts; what arrived is kept in "
                        f"{part} to resume)")


def _attempt(url: str, part: Path, shown: str, progress: Progress | None, timeout: float,
             netrc_file: str | None) -> bool:
    """One request; True when the whole file is in part."""
    have = part.stat().st_size if part.exists() else 0
    request = request_for(url, netrc_file)
    if have:
        request.add_header("Range", f"bytes={have}-")
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        if have and resp.status != 206:  # the server ignored the range: the body is the whole file
            have = 0
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        with open(part, "ab" if have else "wb") as out:
            done = have
            if progress:
                progress(shown, done, total)
            while chunk := resp.read(CHUNK):
                out.write(chunk)
                done += len(chunk)
                if progress:
                    progress(shown, done, total)
    return total is None or done >= total
