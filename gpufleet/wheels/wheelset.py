"""The wheels a host's install needs, as pip resolved them on the host: name, version, file, URL, sha256."""

from __future__ import annotations

import json
from dataclasses import dataclass
from posixpath import basename
from urllib.parse import unquote, urlsplit

from gpufleet.errors import GpufleetError

REPORT_MARK = "@@gpufleet-pip-report@@"


class ReportError(GpufleetError):
    """pip's installation report could not be read."""


@dataclass(frozen=True)
class WheelRef:
    """One file of an install set; `sha256` is None when the index published no hash (the control node hashes it)."""

    name: str
    version: str
    filename: str
    url: str
    sha256: str | None

    def to_json(self) -> dict:
        return {"name": self.name, "version": self.version, "filename": self.filename, "url": self.url,
                "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: dict) -> "WheelRef":
        return cls(data["name"], data["version"], data["filename"], data["url"], data.get("sha256"))


def _sha256_of(download_info: dict) -> str | None:
    archive = download_info.get("archive_info") or {}
    found = (archive.get("hashes") or {}).get("sha256")
    if not found and str(archive.get("hash", "")).startswith("sha256="):
        found = archive["hash"].split("=", 1)[1]
    return found.lower() if found else None


def parse_report(text: str) -> list[WheelRef]:
    """The `install` list of `pip install --dry-run --report` (after REPORT_MARK when the output has one)."""
    body = text.split(REPORT_MARK, 1)[1] if REPORT_MARK in text else text
    try:
        report = json.loads(body)
        items = report["install"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"pip's installation report is not readable ({exc}): {body.strip()[-300:]!r}") from None
    refs = []
    for item in items:
        try:
            meta, info = item["metadata"], item["download_info"]
            url = info["url"]
        except (KeyError, TypeError):
            raise ReportError(f"pip's report has an entry without metadata or download_info: {item!r:.300}") from None
        if "dir_info" in info or not urlsplit(url).path.endswith(".whl"):
            # a local directory or an sdist would be built on the host: nothing to hand over as a wheel
            raise ReportError(f"{meta.get('name')} {meta.get('version')} resolves to {url}, not a wheel: the "
                              f"control node hands hosts wheels only (is a wheel of it on the index?)")
        refs.append(WheelRef(meta["name"], meta["version"], unquote(basename(urlsplit(url).path)), url,
                             _sha256_of(info)))
    return refs


def canonical(name: str) -> str:
    """PEP 503 normal form of a project name (`Flashinfer_Python` -> `flashinfer-python`)."""
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))
