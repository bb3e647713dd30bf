"""The one error hierarchy: every failure a user can cause or meet is a GpufleetError."""

from __future__ import annotations


class GpufleetError(Exception):
    """Base of every error gpufleet reports to a user (printed without a stack trace)."""


class ConfigError(GpufleetError):
    """A configuration file (inventory, stack) is invalid; the message names file, host, field and value."""

    def __init__(self, path: str, problem: str, *, host: str | None = None, field: str | None = None,
                 value: object = None, has_value: bool = False):
        self.path, self.problem, self.host, self.field = path, problem, host, field
        self.value = value
        where = [str(path)]
        if host:
            where.append(f"host {host!r}")
        if field:
            where.append(f"field {field!r}")
        text = ": ".join([", ".join(where), problem])
        if has_value:
            text += f" (got {value!r})"
        super().__init__(text)


class FactError(GpufleetError):
    """A fact could not be read or parsed on a host."""

    def __init__(self, what: str, host: str | None, detail: str = ""):
        self.what, self.host, self.detail = what, host, detail
        msg = f"could not read {what} on host {host or '?'}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class HostKeyError(GpufleetError):
    """A host's SSH key is unknown or has changed; the connection was refused."""


class UnreachableError(GpufleetError):
    """A host could not be reached or authenticated over SSH."""


class RemoteCommandError(GpufleetError):
    """A remote command failed; keeps its Result and Cmd; the message names host, step, command, exit code, tail."""

    def __init__(self, result, cmd=None, *, shown: str | None = None):
        # result: engine.ssh.Result (not imported: ssh imports this module); shown: the command as the message
        # gives it (masked; result.command unless a caller abbreviates it)
        self.result, self.cmd = result, cmd
        self.host, self.step, self.exit_code = result.host, result.step, result.exit_code
        self.command = result.command if shown is None else shown
        self.output_tail = result.tail()
        code = "no exit code (connection lost)" if self.exit_code is None else f"exit code {self.exit_code}"
        msg = f"host {self.host}: step {self.step!r} failed: `{self.command}` returned {code}"
        if self.output_tail.strip():
            msg += "\n--- last lines of output ---\n" + self.output_tail.rstrip()
        super().__init__(msg)


class ConnectionLost(RemoteCommandError, UnreachableError):
    """The SSH connection broke under a command or a transfer (EOF, reset, dead transport): exit_code is None (the
    contract a resumable step's reconnect relies on); a host that stopped answering is unreachable too (exit 3)."""
