"""Installs into a host's venv (resolved on the host, wheels handed over by the control node) and version checks."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from gpufleet import remote
from gpufleet.engine.command import Cmd, Part, Secret
from gpufleet.plan import PlanContext, PlanError, Upload
from gpufleet.roleapi import normalized  # noqa: F401  (roles read it from here)

# The stack alone names package sources: a host's pip.conf (extra indexes, constraints, find-links) would
# otherwise mix other builds into an exact pin.
PIP_ENV = {"PIP_CONFIG_FILE": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def venv_python(ctx: PlanContext) -> str:
    return f"{ctx.host.venv}/bin/python"


def url_part(url: str) -> Part:
    """An index URL as a command argument; one carrying credentials is masked in every display."""
    parts = urlsplit(url)
    return Secret(url) if parts.username or parts.password else url


def installed_packages(ctx: PlanContext, role: str) -> dict[str, str]:
    """The venv's packages from facts; a role cannot plan without them."""
    if ctx.facts.packages is None:
        problems = "; ".join(p for p in ctx.facts.problems if "packages" in p) or "no package list"
        raise PlanError(ctx.host.name, role, f"the venv's packages could not be read ({problems})")
    return ctx.facts.packages


def install_cmd(ctx: PlanContext, requirements: list[str], *, index_url: str | None,
                extra_index_urls: tuple[str, ...] | list[str] = (), pre: bool = False) -> Cmd:
    """One resolver run of the venv's pip from the stack's indexes (small build tools; the stack's wheels go
    through pushed_install)."""
    argv: list[Part] = [venv_python(ctx), "-m", "pip", "install", "--progress-bar", "off",
                        *index_args(ctx, index_url, extra_index_urls, pre), *requirements]
    # cwd /: `python -m` puts the working directory on sys.path; the venv keeps its owner
    return Cmd.of(*argv, env=PIP_ENV, cwd="/", keep_owner=(ctx.host.venv,))


def needs_versions(ctx: PlanContext, pins: dict[str, str]) -> Cmd:
    """A `needed` check: exit 0 while any of the pinned distributions differs, exit 1 once all match."""
    wanted = {name: normalized(version) for name, version in pins.items()}
    return Cmd.of(venv_python(ctx), "-c", remote.program("needs_versions.py", "versions.py"),
                  json.dumps(wanted, sort_keys=True), cwd="/")


# ---- installs handed over by the control node: resolved on the host, fetched once, pushed, installed offline ----

WHEEL_DIR = "/var/cache/gpufleet/wheels"  # wheels pushed by the control node land here on the host

# Resolve on the host (its Python, platform tags and installed packages decide) without installing anything:
# $1 constraints text, $2.. the pip command. pip's report goes to stdout after REPORT_MARK; pip's own lines
# (warnings) come before it.
_RESOLVE = remote.text("pip_resolve.sh")


def resolver_pip(ctx: PlanContext, role: str) -> Upload:
    """gpufleet's pinned pip wheel, on the host already (the engine put it there); runnable as <remote>/pip."""
    if ctx.resolver is None:
        raise PlanError(ctx.host.name, role, "no resolver: the engine hands hosts their wheels (unit tests give one)")
    return ctx.resolver()


def index_args(ctx: PlanContext, index_url: str | None, extra_index_urls=(), pre: bool = False) -> list[Part]:
    extras = [u for u in dict.fromkeys([*extra_index_urls, *ctx.stack.pip.extra_index_urls]) if u != index_url]
    argv: list[Part] = ["--pre"] if pre else []
    if index_url:
        argv += ["--index-url", url_part(index_url)]
    for url in extras:
        argv += ["--extra-index-url", url_part(url)]
    for host in dict.fromkeys(ctx.stack.pip.trusted_hosts):
        argv += ["--trusted-host", host]
    return argv


def wanted_by(ctx: PlanContext) -> str:
    """Who asks for the versions a role installs: stack.toml, or the fleet lock that overrides it."""
    return f"the lock {ctx.lock.path} wants" if ctx.lock else "stack.toml wants"


def constraints(ctx: PlanContext) -> list[str]:
    """`name==version` of every locked distribution (empty without a lock): the host resolves to exactly those."""
    return ctx.lock.constraints() if ctx.lock else []


def resolve_cmd(ctx: PlanContext, pip_wheel: str, requirements: list[str], index: list[Part]) -> Cmd:
    argv: list[Part] = [venv_python(ctx), f"{pip_wheel}/pip", "install", "--dry-run", "--quiet", *index,
                        *requirements]
    return Cmd.of("bash", "-c", _RESOLVE, "resolve", "\n".join(constraints(ctx)), *argv, env=PIP_ENV, cwd="/")


def resolve_on_host(ctx: PlanContext, role: str, requirements: list[str], index: list[Part]):
    """What installing `requirements` would add or change in the host's venv, as pip on the host resolves it."""
    from gpufleet.wheels.wheelset import ReportError, parse_report

    if ctx.read is None:
        raise PlanError(ctx.host.name, role, "cannot resolve without a connection to the host")
    pip_wheel = resolver_pip(ctx, role).remote
    result = ctx.read(resolve_cmd(ctx, pip_wheel, requirements, index), f"{role}: resolve {' '.join(requirements)}")
    if result.exit_code != 0:
        raise PlanError(ctx.host.name, role, f"pip on the host cannot resolve {' '.join(requirements)} "
                                             f"(exit {result.exit_code}):\n{result.tail()}")
    try:
        return parse_report(result.output)
    except ReportError as exc:
        raise PlanError(ctx.host.name, role, str(exc)) from None


def handed_over(ctx: PlanContext, role: str, refs) -> tuple[Upload, ...]:
    """The wheels of `refs` as uploads from the control node; a lock's recorded sha256 wins over the index's."""
    recorded = ctx.lock.file_hashes() if ctx.lock else {}
    uploads = []
    for ref in refs:
        sha = ref.sha256
        if ref.filename in recorded:
            if sha and sha != recorded[ref.filename]:
                raise PlanError(ctx.host.name, role, f"the index now serves {ref.filename} with sha256 {sha}, the "
                                                     f"lock {ctx.lock.path} records {recorded[ref.filename]}: "
                                                     f"refusing a different file under the same name")
            sha = recorded[ref.filename]
        uploads.append(Upload(ref.url, sha, f"{WHEEL_DIR}/{ref.filename}", ref.name, ref.version))
    return tuple(uploads)


def offline_install_cmd(ctx: PlanContext, pip_wheel: str, requirements: list[str]) -> Cmd:
    """Install from the pushed wheels only: no index, so nothing is downloaded on the host."""
    argv: list[Part] = [venv_python(ctx), f"{pip_wheel}/pip", "install", "--progress-bar", "off", "--no-index",
                        "--find-links", WHEEL_DIR, *requirements]
    return Cmd.of("bash", "-c", '"$@" -c <(printf "%s\\n" "$CONSTRAINTS")', "install", *argv,
                  env={**PIP_ENV, "CONSTRAINTS": "\n".join(constraints(ctx))}, cwd="/", keep_owner=(ctx.host.venv,))


def pushed_install(ctx: PlanContext, role: str, requirements: list[str], *, index_url: str | None,
                   extra_index_urls=(), pre: bool = False, extra_uploads: tuple[Upload, ...] = ()):
    """(pins, uploads, install command) for `requirements`: resolved on the host, handed over by the control node."""
    index = index_args(ctx, index_url, extra_index_urls, pre)
    refs = resolve_on_host(ctx, role, requirements, index) if requirements else []
    pip_wheel = resolver_pip(ctx, role)
    pins = {ref.name: ref.version for ref in refs}
    uploads = handed_over(ctx, role, refs) + tuple(extra_uploads)
    pinned = [f"{name}=={version}" for name, version in pins.items()]
    cmd = offline_install_cmd(ctx, pip_wheel.remote, [*pinned, *[u.remote for u in extra_uploads]])
    # the resolver wheel goes along (a no-op when it is there): the install step runs it
    return pins, (pip_wheel, *uploads), cmd
