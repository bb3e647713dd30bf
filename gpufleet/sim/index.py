"""A PEP 503 simple package index of the stand-in wheels, served by the stdlib HTTP server."""

from __future__ import annotations

import hashlib
import html
import shutil
import sys
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


def page(title: str, links: list[tuple[str, str]]) -> str:
    anchors = "".join(f'    <a href="{html.escape(href)}">{html.escape(text)}</a><br/>\n' for href, text in links)
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n    <meta name=\"pypi:repository-version\" content=\"1.0\">\n"
        f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
        f"{anchors}  </body>\n</html>\n"
    )


def project_page(name: str, files: list[Path]) -> str:
    links = [(f"../../files/{quote(f.name)}#sha256={sha256_of(f)}", f.name) for f in sorted(files)]
    return page(f"Links for {name}", links)


def build_index(wheels: list[Path], root: Path) -> Path:
    """Copy wheels to root/files and (re)write root/simple for every archive there; returns root/simple."""
    files_dir, simple = Path(root) / "files", Path(root) / "simple"
    files_dir.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        if Path(wheel).resolve() != (files_dir / Path(wheel).name).resolve():
            shutil.copy2(wheel, files_dir / Path(wheel).name)
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
