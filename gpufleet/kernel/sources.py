"""Sources sgl-kernel's CMake fetches at configure time (FetchContent): read from the CMakeLists, fetched once on the
control node into its cache, handed to each host, and named to CMake so no host needs GitHub."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from gpufleet.kernel import cmake
from gpufleet.errors import GpufleetError
from gpufleet.facts.checkout import redact_url

HOST_DIR = "/var/cache/gpufleet/sources"  # on each host: <name>-<tag>.tar handed over, <name>-<tag>/ unpacked
_SHA = re.compile(r"^[0-9a-f]{40}$")
_KEYWORDS = {"GIT_REPOSITORY", "GIT_TAG", "GIT_SHALLOW", "GIT_PROGRESS", "GIT_SUBMODULES", "URL", "URL_HASH",
             "SOURCE_SUBDIR", "EXCLUDE_FROM_ALL", "SYSTEM", "OVERRIDE_FIND_PACKAGE", "FIND_PACKAGE_ARGS",
             "PATCH_COMMAND", "UPDATE_DISCONNECTED", "DOWNLOAD_EXTRACT_TIMESTAMP", "GIT_REMOTE_UPDATE_STRATEGY"}


class SourceError(GpufleetError):
    """A FetchContent dependency could not be read from the CMakeLists or fetched on the control node."""


@dataclass(frozen=True)
class Dependency:
    """One FetchContent_Declare: its content name, the repository and tag as the CMakeLists declares them."""

    name: str
    repository: str
    tag: str
    submodules: bool = True  # FetchContent clones submodules unless GIT_SUBMODULES "" says otherwise

    @property
    def cmake_var(self) -> str:
        """The cache variable FetchContent reads instead of downloading (it upper-cases the name, keeps hyphens)."""
        return f"FETCHCONTENT_SOURCE_DIR_{self.name.upper()}"

    @property
    def slug(self) -> str:
        tag = self.tag[:12] if _SHA.match(self.tag) else re.sub(r"[^A-Za-z0-9._-]+", "_", self.tag)
        return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', self.name)}-{tag}"

    @property
    def archive(self) -> str:
        """Where the handed-over archive lands on the host."""
        return f"{HOST_DIR}/{self.slug}.tar"

    @property
    def source_dir(self) -> str:
        """Where the host unpacks it: the directory CMake is pointed at."""
        return f"{HOST_DIR}/{self.slug}"

    def fetch_url(self, mirrors: dict[str, str] | None = None) -> str:
        """`git+<repository>@<tag>`, with the first matching mirror prefix applied (a site's GitHub mirror)."""
        repo = self.repository
        for prefix, replacement in sorted((mirrors or {}).items(), key=lambda kv: -len(kv[0])):
            if repo.startswith(prefix):
                repo = replacement + repo[len(prefix):]
                break
        return f"git+{repo}@{self.tag}" + ("" if self.submodules else "#no-submodules")


def parse_declarations(text: str, where: str = "CMakeLists.txt") -> list[Dependency]:
    """Every FetchContent_Declare of a CMakeLists, in order. A declaration gpufleet cannot hand over (a URL download,
    a tag built from a variable) is a SourceError naming it: the build would then need the network."""
    try:
        declared = [c for c in cmake.commands(text) if c.name == "fetchcontent_declare"]
    except cmake.CMakeError as exc:
        raise SourceError(f"{where}: {exc}") from None
    found: list[Dependency] = []
    for command in declared:
        args = command.args
        if not args:
            raise SourceError(f"{where}:{command.line}: FetchContent_Declare() without a name")
        name, options = args[0], {}
        key = None
        for arg in args[1:]:
            if arg.upper() in _KEYWORDS:
                key = arg.upper()
                options.setdefault(key, [])
            elif key:
                options[key].append(arg)
        repo = " ".join(options.get("GIT_REPOSITORY", []))
        tag = " ".join(options.get("GIT_TAG", []))
        if not repo:
            how = "a URL download" if "URL" in options else "no GIT_REPOSITORY"
            raise SourceError(f"{where}: FetchContent_Declare({name}) has {how}: gpufleet hands over git sources only")
        if "${" in repo or "${" in tag or not tag:
            raise SourceError(f"{where}: FetchContent_Declare({name}) names repository {repo!r} tag {tag!r}: "
                              "a variable or a missing tag cannot be fetched ahead of the build")
        # GIT_SUBMODULES "" (or an empty list) turns FetchContent's default recursive submodule clone off
        submodules = "GIT_SUBMODULES" not in options or any(options["GIT_SUBMODULES"])
        found.append(Dependency(name, repo, tag, submodules))
    return found


def cmake_defines(deps: list[Dependency]) -> dict[str, str]:
    """What CMake is told: each dependency's unpacked source dir, and never to reach the network."""
    defines = {d.cmake_var: d.source_dir for d in deps}
    if deps:
        defines["FETCHCONTENT_FULLY_DISCONNECTED"] = "ON"
    return defines


def unpack_script(deps: list[Dependency]) -> str:
    """Bash that unpacks each handed-over archive once (into a temporary dir, renamed into place)."""
    lines = ["set -e"]
    for d in deps:
        lines.append(f'if [ ! -d {_q(d.source_dir)} ]; then rm -rf {_q(d.source_dir + ".tmp")}; '
                     f'mkdir -p {_q(d.source_dir + ".tmp")}; tar -xf {_q(d.archive)} -C {_q(d.source_dir + ".tmp")}; '
                     f'mv {_q(d.source_dir + ".tmp")} {_q(d.source_dir)}; fi')
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    import shlex

    return shlex.quote(text)


# ---- the control node's cache --------------------------------------------------------------------------------------
def is_git_url(url: str) -> bool:
    return url.startswith("git+")


def split_git_url(url: str) -> tuple[str, str]:
    """`git+<repository>@<tag>[#no-submodules]` -> (repository, tag)."""
    body = url.removeprefix("git+").split("#", 1)[0]
    repo, sep, tag = body.rpartition("@")
    if not sep or not repo or not tag or "/" in tag and not tag.startswith("refs/"):
        raise SourceError(f"not a git source URL (git+<repository>@<tag>): {redact_url(body)}")
    return repo, tag


def archive_name(url: str) -> str:
    repo, tag = split_git_url(url)
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", repo.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git"))
    return f"{base}-{tag[:12] if _SHA.match(tag) else re.sub(r'[^A-Za-z0-9._-]+', '_', tag)}.tar"


_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def fetch_archive(url: str, root: Path) -> Path:
    """The tree of repository@tag as a tar under root/git/<sha256 of url>/; fetched once, then reused for a commit
    sha (immutable), fetched again each time for a branch or tag name. `git archive` of one commit is the same bytes
    every time, so the tar's sha256 names the content."""
    repo, tag = split_git_url(url)
    submodules = not url.endswith("#no-submodules")
    home = Path(root) / "git" / hashlib.sha256(url.encode()).hexdigest()
    target = home / archive_name(url)
    with _guard:
        lock = _locks.setdefault(str(target), threading.Lock())
    with lock:
        if target.is_file() and _SHA.match(tag):
            return target
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="gpufleet-source-", dir=home) as tmp:
            env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}

            def git(*args: str) -> str:
                proc = subprocess.run(["git", "-C", tmp, *args], capture_output=True, text=True, env=env, timeout=3600)
                if proc.returncode != 0:
                    raise SourceError(f"cannot fetch {redact_url(repo)} at {tag} on the control node: git "
                                      f"{args[0]}: {(proc.stderr or proc.stdout).strip()[-400:]}")
                return proc.stdout

            git("init", "-q")
            git("fetch", "-q", "--depth", "1", repo, tag)
            git("-c", "advice.detachedHead=false", "checkout", "-q", "FETCH_HEAD")
            if submodules and (Path(tmp) / ".gitmodules").exists():
                git("submodule", "update", "-q", "--init", "--recursive", "--depth", "1")
            part = target.with_name(target.name + ".part")
            # a fixed order, time and owner: the same commit gives the same bytes, so its sha256 names the content
            proc = subprocess.run(["tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner",
                                   "--exclude=.git", "-C", tmp, "-cf", str(part), "."], capture_output=True, text=True)
            if proc.returncode != 0:
                part.unlink(missing_ok=True)
                raise SourceError(f"archiving {redact_url(repo)} at {tag} failed: {proc.stderr[-400:]}")
            os.replace(part, target)
    return target
