"""Become: privileged commands of a non-root login go through sudo; the one place a command is wrapped for the wire.

A host with `become = true` has every command run as `sudo -n -H -u USER -- /bin/bash -c TEXT` (no password
needed), or `sudo -S -k -p '' -H -u USER -- /bin/bash -c TEXT` with the password as the first line of stdin (`-k`
ignores any cached credential, so sudo always reads exactly that line and the rest of stdin, e.g. push's tar
stream, reaches the command; `-p ''` prints no prompt; EOF after the line means a wrong password fails at once).
TEXT travels in a quoted here-document, not re-quoted, so a 100 KB script stays 100 KB. A `Cmd(login=True)` (a read
needing no privilege) runs as the login user, unwrapped. Which form a host needs is proved once per connection
(`prove`), before anything runs: a refusal is one `BecomeError` naming the host and the command."""

from __future__ import annotations

import secrets as _random
import shlex
from dataclasses import dataclass

from gpufleet.engine.command import Cmd
from gpufleet.errors import GpufleetError

PROOF_TIMEOUT = 30.0


class BecomeError(GpufleetError):
    """sudo refused (wrong or missing password, a sudoers rule): names the host, the command and sudo's answer."""

    def __init__(self, host: str, command: str, answer: str):
        self.host, self.command, self.answer = host, command, answer
        super().__init__(f"host {host}: sudo refused `{command}`: {answer.strip() or 'no answer'}; nothing was "
                         f"changed (check the host's sudoers rule for its login user and become_password_*)")


@dataclass(frozen=True)
class Become:
    """How one host's privileged commands run: as `user`, with a sudo password (None: sudo -n, never a prompt)."""

    user: str = "root"
    password: str | None = None

    @classmethod
    def of(cls, host) -> "Become | None":
        if not getattr(host, "become", False):
            return None
        return cls(user=host.become_user, password=getattr(host, "become_password", None))

    def sudo(self) -> str:
        """The sudo prefix (shell text)."""
        if self.password is None:
            return f"sudo -n -H -u {shlex.quote(self.user)} --"
        return f"sudo -S -k -p '' -H -u {shlex.quote(self.user)} --"

    def stdin(self) -> bytes:
        """What goes first on the command's stdin: the password line, or nothing."""
        return b"" if self.password is None else self.password.encode() + b"\n"


@dataclass(frozen=True)
class Wire:
    """A command as sent: the shell text for exec, the bytes to write first on its stdin, the text shown."""

    text: str
    stdin: bytes
    shown: str


def _heredoc(text: str) -> tuple[str, str]:
    while True:
        delim = f"GPUFLEET_{_random.token_hex(6)}"
        if delim not in text:
            return delim, f"\"$(cat <<'{delim}'\n{text}\n{delim}\n)\""


def wrap_text(text: str, become: Become | None) -> tuple[str, bytes]:
    """Shell text run through become's sudo (unchanged without become), and the stdin prefix it needs."""
    if become is None:
        return text, b""
    _, quoted = _heredoc(text)
    return f"{become.sudo()} /bin/bash -c {quoted}", become.stdin()


def wire(cmd: Cmd, become: Become | None) -> Wire:
    """The one wrapping of a command for a host: used by HostSession.run, .channel and OpenSSH pushes."""
    if become is None or cmd.login:
        return Wire(cmd.render(), b"", cmd.display())
    # sudo logs the command line it runs (syslog, the journal): secrets go on stdin, after the password line
    inner, secrets = cmd.render_secrets_on_stdin()
    text, stdin = wrap_text(inner, become)
    return Wire(text, stdin + secrets, f"{become.sudo()} {cmd.display()}")


def proof(become: Become) -> Cmd:
    """The command that proves sudo works in the exact shape every command will use."""
    return Cmd.of("true")


def prove(session, become: Become) -> None:
    """Run `true` through sudo as every command will; refusal, a wrong password or a hang is one BecomeError."""
    result = session.run(proof(become), step="become", check=False, timeout=PROOF_TIMEOUT)
    if result.exit_code != 0:
        shown = f"{become.sudo()} /bin/bash -c true"
        answer = result.output if result.exit_code is not None else f"no answer within {PROOF_TIMEOUT:.0f}s"
        raise BecomeError(session.name, shown, answer)
