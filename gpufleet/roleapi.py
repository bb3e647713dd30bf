"""What a role declares it owns, once: its stack section, packages, status columns and what verify imports."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Callable, Iterable

from packaging.version import InvalidVersion, Version

from gpufleet.errors import ConfigError
from gpufleet.remote.versions import versions_match

if TYPE_CHECKING:
    from gpufleet.config.stack import Stack
    from gpufleet.facts.model import HostFacts


def normalized(version: str) -> str:
    """The PEP 440 normal form, as installed metadata spells it (`0.6.05` -> `0.6.5`)."""
    try:
        return str(Version(version))
    except InvalidVersion:
        return version


@dataclass
class Cell:
    """One component on one host: what it is, what it should be, and whether that differs."""

    current: str
    expected: str
    drift: bool
    note: str = ""


def _read(path: str) -> Callable[[Stack], str]:
    return lambda stack: reduce(getattr, path.split("."), stack)


def _write(path: str) -> Callable[[Stack, str], Stack]:
    def pin(stack, version):
        section, _, field = path.rpartition(".")
        if not section:
            return stack.model_copy(update={field: version})
        head, _, rest = section.partition(".")
        inner = _write(f"{rest}.{field}" if rest else field)(getattr(stack, head), version)
        return stack.model_copy(update={head: inner})
    return pin


@dataclass(frozen=True)
class Package:
    """A distribution a role installs: its names, the version the stack wants, how a fleet lock's version is kept."""

    name: str  # PEP 503 normalised, as pip lists it
    want: Callable[[Stack], str] | None = None  # the stack's pin; None: built or checked out (no status cell)
    pin: Callable[[Stack, str], Stack] | None = None  # the stack with a lock's version of it (locked_stack)
    aliases: tuple[str, ...] = ()  # the same package under another distribution name
    heading: str = ""  # its status column's heading (default: the name)
    verified: bool = True  # verify compares its installed metadata with `want`

    @classmethod
    def at(cls, name: str, path: str, **kw) -> "Package":
        """A package pinned by one stack field ("torch.version"), which a fleet lock's version replaces."""
        return cls(name, want=_read(path), pin=_write(path), **kw)

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def wanted(self, stack: Stack) -> str:
        return normalized(self.want(stack))


@dataclass(frozen=True)
class Column:
    """A status column whose cell is not a plain pinned package (sglang's checkout, sgl-kernel from it)."""

    key: str
    cell: Callable[[HostFacts, Stack], Cell]
    heading: str = ""


@dataclass(frozen=True)
class Import:
    """A module verify imports with the whole stack, the distributions named when it fails, what it must export."""

    module: str
    dists: tuple[str, ...]
    ops: tuple[str, ...] = ()  # attributes of the module (or torch.ops.<module>) it must have
    ops_label: str = ""  # what they are, in messages: "FP4"
    hints: tuple[tuple[str, str], ...] = ()  # (text in the import error, advice added to the problem)


@dataclass(frozen=True)
class Declares:
    """Everything a role owns; status, render, the lock, verify and the package list read it from the registry."""

    section: str | None = None  # the stack.toml table it reads
    packages: tuple[Package, ...] = ()  # pinned ones get a status column each, in this order
    columns: tuple[Column, ...] = ()  # further status columns, after its packages'
    imports: tuple[Import, ...] = ()  # in the order sglang imports them
    needs: tuple[str, ...] = ()  # roles (by name) it builds on; "*": every role before it in the registry


def packages(roles: Iterable) -> list[Package]:
    """Every declared package, in registry order."""
    return [p for role in roles for p in role.declares.packages]


def package_cell(installed: dict[str, str] | None, package: Package, stack: Stack) -> Cell:
    expected = package.want(stack)
    if installed is None:
        return Cell("?", expected, True, "packages could not be read")
    current = next((installed[n] for n in package.names() if n in installed), None)
    return Cell(current or "absent", expected, not versions_match(current, normalized(expected)))


def columns(roles: Iterable) -> list[Column]:
    """The status columns of the roles, in registry order: each pinned package, then the role's own columns."""
    found = []
    for role in roles:
        for p in role.declares.packages:
            if p.want is not None:
                found.append(Column(p.name, lambda facts, stack, p=p: package_cell(facts.packages, p, stack),
                                    p.heading))
        found += role.declares.columns
    return found


def needs(role, roles) -> tuple[str, ...]:
    """The names of the roles `role` builds on (its declared `needs`, "*" as every role before it)."""
    declared = role.declares.needs
    if "*" not in declared:
        return tuple(declared)
    names = [r.name for r in roles]
    before = names[:names.index(role.name)] if role.name in names else names
    return tuple(dict.fromkeys([*before, *(d for d in declared if d != "*")]))


@dataclass(frozen=True)
class Selection:
    """`--only` / `--skip`: the roles left out (name -> why) and whether `--force` lets a role run although a role
    it needs is left out and not on target (without it that role is refused on that host, naming the dependency)."""

    left_out: dict[str, str]
    force: bool = False

    def runs(self, name: str) -> bool:
        return name not in self.left_out

    def broken(self, roles) -> dict[str, tuple[str, ...]]:
        """Each role that runs -> the roles it needs that are left out (refused where those are not on target)."""
        found = {}
        for role in roles:
            if self.runs(role.name):
                missing = tuple(d for d in needs(role, roles) if not self.runs(d))
                if missing:
                    found[role.name] = missing
        return found


def _names(flag: str, spec: str | None, known: list[str]) -> list[str]:
    if spec is None:
        return []
    names = [n.strip() for n in str(spec).split(",") if n.strip()]
    if not names:
        raise ConfigError(flag, f"name at least one role; known roles: {', '.join(known)}", value=spec,
                          has_value=True)
    for name in names:
        if name not in known:
            raise ConfigError(flag, f"unknown role {name!r}; known roles: {', '.join(known)}", value=spec,
                              has_value=True)
    return names


def select(roles, only: str | None = None, skip: str | None = None, force: bool = False) -> Selection | None:
    """The roles to run from `--only a,b` and `--skip c` (names as the registry spells them); None when neither
    is given. Unknown names and a selection that leaves nothing are ConfigErrors listing the known roles."""
    known = [r.name for r in roles]
    chosen, dropped = _names("--only", only, known), _names("--skip", skip, known)
    if not chosen and not dropped:
        return None
    left_out = {}
    for name in known:
        if chosen and name not in chosen:
            left_out[name] = "not in --only"
        elif name in dropped:
            left_out[name] = "--skip"
    if len(left_out) == len(known):
        raise ConfigError("--only/--skip", f"leave no role to run; known roles: {', '.join(known)}",
                          value=",".join(filter(None, [only, skip])), has_value=True)
    return Selection(left_out, force)
