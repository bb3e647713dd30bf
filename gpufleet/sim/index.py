"""A PEP 503 simple package index of the stand-in wheels, served by the stdlib HTTP server."""

from __future__ import annotations

import hashlib
import html
import shutil
import sys
import zipfile
from pathlib import Path
from urllib.parse import quote

from gpufleet.sim.wheels import normalize

ARCHIVE_SUFFIXES = (".whl", ".tar.gz", ".zip")


def project_of(filename: str) -> str:
    """Normalized project name of a wheel or sdist file name."""
    if filename.endswith(".whl"):
        return normalize(filename.split("-")[0])
    stem = filename.removesuffix(".tar.gz").removesuffix(".zip")
    return normalize(stem.rsplit("-", 1)[0])


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def page(title: str, links: list[tuple[str, str]] | list[tuple[str, str, str]]) -> str:
    anchors = "".join(f'    <a href="{html.escape(href)}"{attrs}>{html.escape(text)}</a><br/>\n'
                      for href, text, *rest in links for attrs in [rest[0] if rest else ""])
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n    <meta name=\"pypi:repository-version\" content=\"1.0\">\n"
        f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
        f"{anchors}  </body>\n</html>\n"
    )


def wheel_metadata(path: Path) -> bytes:
    """The METADATA file inside a wheel: what PEP 658 serves beside it as `<file>.metadata`."""
    with zipfile.ZipFile(path) as archive:
        member = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return archive.read(member)


def metadata_attrs(path: Path) -> str:
    """PEP 658/714 attributes announcing the wheel's metadata file, as PyPI and PyTorch's index serve them: a
    resolver (pip on each host) reads a wheel's dependencies without downloading the wheel."""
    meta = path.with_name(path.name + ".metadata")
    if not meta.exists():
        return ""
    digest = f"sha256={hashlib.sha256(meta.read_bytes()).hexdigest()}"
    return f' data-dist-info-metadata="{digest}" data-core-metadata="{digest}"'


def project_page(name: str, files: list[Path]) -> str:
    links = [(f"../../files/{quote(f.name)}#sha256={sha256_of(f)}", f.name, metadata_attrs(f)) for f in sorted(files)]
    return page(f"Links for {name}", links)


def build_index(wheels: list[Path], root: Path) -> Path:
    """Copy wheels to root/files and (re)write root/simple for every archive there; returns root/simple."""
    files_dir, simple = Path(root) / "files", Path(root) / "simple"
    files_dir.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        if Path(wheel).resolve() != (files_dir / Path(wheel).name).resolve():
            shutil.copy2(wheel, files_dir / Path(wheel).name)
    for archive in files_dir.glob("*.whl"):
        meta = wheel_metadata(archive)
        # pip before 23.3 rejects a metadata file whose Name is not spelled in normal form (scikit_build_core):
        # those wheels are served without one, as an index without PEP 658 would
        if f"\nName: {project_of(archive.name)}\n".encode() in meta:
            archive.with_name(archive.name + ".metadata").write_bytes(meta)
    projects: dict[str, list[Path]] = {}
    for archive in sorted(files_dir.iterdir()):
        if archive.name.endswith(ARCHIVE_SUFFIXES):
            projects.setdefault(project_of(archive.name), []).append(archive)
    for name, files in projects.items():
        (simple / name).mkdir(parents=True, exist_ok=True)
        (simple / name / "index.html").write_text(project_page(name, files))
    (simple / "index.html").write_text(page("Simple index", [(f"{name}/", name) for name in sorted(projects)]))
    return simple


def serve_index_command(root: Path, host: str, port: int) -> list[str]:
    """argv of a stdlib HTTP server serving root (the index URL is http://host:port/simple)."""
    return [sys.executable, "-m", "http.server", "--bind", host, "--directory", str(root), str(port)]
