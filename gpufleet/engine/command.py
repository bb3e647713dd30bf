"""Remote commands as data: the one place where arguments are quoted and secrets are masked."""

from __future__ import annotations

import base64
import shlex
import threading
from dataclasses import dataclass, replace
from typing import Iterable, Union
from urllib.parse import unquote, urlsplit

from gpufleet import remote

MASK = "********"
# Every Secret's value (and an index URL's password) is registered here for the life of the process: a command that
# pastes a rendered Cmd into a script (the secret then sits in a plain string), a log line or an error tail is masked
# by display() and mask() all the same. Shorter values are not masked in free text (they would blank common words).
_REGISTERED: set[str] = set()
_REGISTER_LOCK = threading.Lock()
MIN_REGISTERED = 4


def register(value: str) -> None:
    """Mask value in every displayed command and every masked text from now on."""
    if value and len(value) >= MIN_REGISTERED:
        with _REGISTER_LOCK:
            _REGISTERED.add(value)


def registered() -> frozenset[str]:
    with _REGISTER_LOCK:
        return frozenset(_REGISTERED)


@dataclass(frozen=True)
class Secret:
    """A value that must reach the host but never appear in output, logs or errors."""

    value: str

    def __post_init__(self) -> None:
        register(self.value)
        if "@" in self.value and "://" in self.value:  # an index URL's password, wherever it shows up alone
            try:
                password = urlsplit(self.value).password
            except ValueError:
                password = None
            if password:
                register(password)
                register(unquote(password))

    def __str__(self) -> str:  # a stray f-string must not leak it
        return MASK

    __repr__ = __str__


@dataclass(frozen=True)
class Raw:
    """Shell syntax passed through unquoted (pipes, redirections); use sparingly."""

    text: str


Part = Union[str, Secret, Raw, int]


def _quote(part: Part, masked: bool, refs: list[str] | None = None) -> str:
    if isinstance(part, Raw):
        return part.text
    if isinstance(part, Secret):
        if refs is not None:  # read from stdin by the prelude of render_secrets_on_stdin
            refs.append(part.value)
            return f'"${_SECRET_VAR}{len(refs) - 1}"'
        return MASK if masked else shlex.quote(part.value)
    return shlex.quote(str(part))


_SECRET_VAR = "GPUFLEET_SECRET_"


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

    def _render(self, masked: bool, refs: list[str] | None = None) -> str:
        text = " ".join(_quote(p, masked, refs) for p in self.argv)
        if self.env:
            assigns = " ".join(f"{k}={_quote(v, masked, refs)}" for k, v in self.env)
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

    def render_secrets_on_stdin(self) -> tuple[str, bytes]:
        """The shell text with no secret in it, and what must come first on its stdin: each Secret part as one
        base64 line, read (and exported, for keep_owner's inner shell) before the command runs. For a wrapper that
        logs its command line (sudo writes it to the journal); without Secret parts, render() and no stdin."""
        refs: list[str] = []
        text = self._render(masked=False, refs=refs)
        if not refs:
            return text, b""
        # the trailing "x" keeps a value's own trailing newlines, which $( ) would strip
        prelude = "".join(f'IFS= read -r {v} && {v}="$(printf %s "${v}" | base64 -d && printf x)" && {v}="${{{v}%x}}" '
                          f'&& export {v} || exit 97; ' for v in (f"{_SECRET_VAR}{i}" for i in range(len(refs))))
        stdin = b"".join(base64.b64encode(value.encode()) + b"\n" for value in refs)
        return prelude + text, stdin

    def display(self) -> str:
        """The text shown to people and written to logs (secrets masked, registered ones in plain parts too)."""
        return mask(self._render(masked=True), ())

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
    """Replace every occurrence of each secret, and of every registered one, in free text (command output, error
    tails, displayed commands)."""
    for s in sorted({s for s in secrets if s} | registered(), key=len, reverse=True):
        text = text.replace(s, MASK)
    return text
