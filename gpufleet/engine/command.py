"""Remote commands as data: the one place where arguments are quoted and secrets are masked."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Iterable, Union

from gpufleet import remote

MASK = "********"


@dataclass(frozen=True)
class Secret:
    """A value that must reach the host but never appear in output, logs or errors."""

    value: str

    def __str__(self) -> str:  # a stray f-string must not leak it
        return MASK

    __repr__ = __str__


@dataclass(frozen=True)
class Raw:
    """Shell syntax passed through unquoted (pipes, redirections); use sparingly."""

    text: str


Part = Union[str, Secret, Raw, int]


def _quote(part: Part, masked: bool) -> str:
    if isinstance(part, Raw):
        return part.text
    if isinstance(part, Secret):
        return MASK if masked else shlex.quote(part.value)
    return shlex.quote(str(part))


@dataclass(frozen=True)
class Cmd:
    """One remote command: argv parts, optional environment, working directory and stdin-free execution.

    login: a read needing no privilege; on a `become` host it runs as the login user, not through sudo.
    keep_owner: paths (a venv, a checkout) whose owner keeps what the command creates under them
    (`remote/keep_owner.sh`: root's new files handed back to a non-root owner; nothing changes for root's paths).
    """

    argv: tuple[Part, ...]
    env: tuple[tuple[str, Part], ...] = ()
    cwd: str | None = None
    login: bool = False
    keep_owner: tuple[str, ...] = ()

    @classmethod
    def of(cls, *argv: Part, env: dict[str, Part] | None = None, cwd: str | None = None, login: bool = False,
           keep_owner: tuple[str, ...] | list[str] = ()) -> "Cmd":
        return cls(tuple(argv), tuple(sorted((env or {}).items())), cwd, login, tuple(keep_owner))

    def owned_by(self, *paths: str) -> "Cmd":
        """This command, keeping the owners of paths (see keep_owner)."""
        return replace(self, keep_owner=tuple(dict.fromkeys(self.keep_owner + paths)))

    def _render(self, masked: bool) -> str:
        text = " ".join(_quote(p, masked) for p in self.argv)
        if self.env:
            assigns = " ".join(f"{k}={_quote(v, masked)}" for k, v in self.env)
            text = f"env {assigns} {text}"
        if self.cwd:
            text = f"cd {shlex.quote(self.cwd)} && {text}"
        if self.keep_owner:
            paths = " ".join(shlex.quote(p) for p in self.keep_owner)
            wrapper = "<keep_owner.sh>" if masked else shlex.quote(remote.text("keep_owner.sh"))
            text = f"bash -c {wrapper} keep-owner {paths} -- {shlex.quote(text)}"
        return text

    def render(self) -> str:
        """The exact shell text sent to the host (secrets in clear)."""
        return self._render(masked=False)

    def display(self) -> str:
        """The text shown to people and written to logs (secrets masked)."""
        return self._render(masked=True)

    def secrets(self) -> list[str]:
        found = [p.value for p in self.argv if isinstance(p, Secret)]
        found += [v.value for _, v in self.env if isinstance(v, Secret)]
        return found

    def __str__(self) -> str:
        return self.display()


def script(text: str, *, interpreter: str = "bash") -> Cmd:
    """A multi-line script run by an interpreter reading it from a quoted argument."""
    return Cmd.of(interpreter, "-c", text)


def mask(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret in free text (command output, error tails)."""
    for s in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(s, MASK)
    return text
