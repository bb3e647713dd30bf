"""Backend probe on a host: each candidate as a transient systemd unit, health-gated, asked, timed, and stopped."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from gpufleet import remote
from gpufleet.fleet import health
from gpufleet.engine.command import Cmd
from gpufleet.engine.query import Query, ask
from gpufleet.errors import GpufleetError
from gpufleet.facts.script import unit_name
from gpufleet.fleet.health import Gate, HealthError
from gpufleet.probe.candidates import CORRECT, ERROR, FAILED, TIMEOUT, WRONG, Candidate, Outcome, candidate_stack, failure_reason
from gpufleet.probe.candidates import judge, tokens_per_second
from gpufleet.roles.model_server import env_path, environment, exec_args, python_minor, served_name

UNIT_PREFIX = "gpufleet-probe-"
PORT_WAIT = 60  # seconds for a stopped server's port to be released
GENERATION_TIMEOUT = 900.0  # one long generation on a cold server may compile kernels


def probe_unit(token: str, number: int) -> str:
    """A candidate's transient unit: the run's token keeps its journal apart from earlier probes'."""
    return f"{UNIT_PREFIX}{token[:8]}-{number}.service"


def _systemd_word(word: str) -> str:
    # systemd expands $VAR and $$ in a transient unit's argv too (checked on systemd 252): $$ keeps a $ literal.
    return word.replace("$", "$$")


def start_cmd(unit: str, argv: list[str], env: dict[str, str], env_file: str) -> Cmd:
    """systemd-run of argv with the production unit's environment and secrets file; no restart on failure."""
    props = [f"--property=EnvironmentFile=-{env_file}", "--property=TimeoutStopSec=120",
             f"--property=SyslogIdentifier={unit.removesuffix('.service')}"]
    return Cmd.of("systemd-run", "--quiet", f"--unit={unit}", "--collect", *props,
                  *[f"--setenv={k}={v}" for k, v in env.items()], "--", *[_systemd_word(w) for w in argv])






def stop_cmd(unit: str) -> Cmd:
    """Stop a unit and prove it gone: not active, no main pid."""
    return Cmd.of("bash", "-c", remote.text("unit_stop.sh"), "stop", unit)


def port_free_cmd(address: str, port: int, wait: int = PORT_WAIT) -> Cmd:
    """Wait until nothing accepts connections on address:port (the next server must bind it)."""
    return Cmd.of("bash", "-c", remote.text("port_free.sh"), "port-free", address, str(port), str(wait))


def leftovers_cmd() -> Cmd:
    """Stop probe units a killed earlier probe left running."""
    return Cmd.of("bash", "-c", remote.text("probe_leftovers.sh"), "leftovers", UNIT_PREFIX)


@dataclass
class CandidateGate(Gate):
    """The health gate watching a candidate's transient unit instead of the production unit."""

    probe_unit: str = ""

    @property
    def unit(self) -> str:
        return self.probe_unit


def chat(model: str, prompt: str, max_tokens: int, *, ignore_eos: bool = False) -> dict:
    """A deterministic chat completion; thinking off so the answer is in content."""
    payload = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
               "max_tokens": max_tokens, "chat_template_kwargs": {"enable_thinking": False}}
    if ignore_eos:
        payload["ignore_eos"] = True  # sglang's sampling extension: a throughput run generates max_tokens exactly
    return payload


@dataclass
class HostProber:
    """Runs candidates on one host over its session; the production server must already be stopped."""

    session: object
    host_stack: object
    base_stack: object
    token: str
    say: Callable[[str], None] = lambda line: None
    python_version: str | None = None
    current_unit: str | None = None  # the candidate unit that may be running now (stopped on the way out)

    @property
    def address(self) -> str:
        return CandidateGate(self.session, self.host_stack).address

    def run(self, cmd: Cmd, step: str, timeout: float = 120, check: bool = True):
        return self.session.run(cmd, step=step, check=check, timeout=timeout)

    def venv_python(self) -> str:
        """The venv's Python minor version (the unit's LD_LIBRARY_PATH names its site-packages)."""
        if self.python_version is None:
            host = self.session.host
            out = self.run(Cmd.of(f"{host.venv}/bin/python", "-c",
                                  "import sys; print('%d.%d' % sys.version_info[:2])"), "venv python").output
            self.python_version = python_minor(out.strip().splitlines()[-1] if out.strip() else "", host.name)
        return self.python_version

    def stop(self, unit: str) -> None:
        self.run(stop_cmd(unit), f"stop {unit}")
        self.run(port_free_cmd(self.address, self.host_stack.server.port), "port free", timeout=PORT_WAIT + 30)

    def try_candidate(self, number: int, candidate: Candidate) -> Outcome:
        """Start, gate, ask, time and stop one candidate; every failure is recorded, never raised."""
        out = Outcome(candidate, unit=probe_unit(self.token, number))
        try:
            self._run(out)
        except HealthError as exc:
            out.outcome = TIMEOUT if "did not answer 200" in exc.problem else FAILED
            out.reason = (exc.problem if out.outcome == TIMEOUT else failure_reason(exc.journal) or exc.problem)
        except GpufleetError as exc:
            out.outcome, out.reason = ERROR, str(exc).splitlines()[0][:200]
        finally:
            if self.current_unit:
                self.stop(self.current_unit)  # a stop that fails raises: the next candidate must not start
                self.current_unit = None
        return out

    def _run(self, out: Outcome) -> None:
        host, stack = self.session.host, candidate_stack(self.host_stack, out.candidate, self.base_stack)
        argv = exec_args(host, stack)
        env = environment(host, stack, self.venv_python())
        started = time.monotonic()
        self.run(start_cmd(out.unit, argv, env, env_path(host)), f"start {out.unit}")
        self.current_unit = out.unit
        gate = CandidateGate(self.session, stack, probe_unit=out.unit, say=self.say)
        gate.wait_healthy()
        out.load_seconds = round(time.monotonic() - started, 1)
        model, probe = served_name(host, stack), stack.probe
        answers = [self._ask(gate, chat(model, p.prompt, probe.answer_max_tokens))[0] for p in probe.prompts]
        out.answers = [{"prompt": p.prompt, "expect": p.expect, "answer": a[:300]} for p, a in zip(probe.prompts, answers)]
        ok, why = judge(probe.prompts, answers)
        began = time.monotonic()
        _, completion = self._ask(gate, chat(model, probe.throughput_prompt, probe.throughput_max_tokens,
                                             ignore_eos=True))
        out.tokens_per_second = tokens_per_second(completion, time.monotonic() - began)
        out.outcome, out.reason = (CORRECT, "every known answer found") if ok else (WRONG, why)

    def _ask(self, gate: CandidateGate, payload: dict) -> tuple[str, int | None]:
        """One chat completion: (answer text, completion tokens from usage)."""
        try:
            resp = health.request(self.session, self.host_stack.server.port, "POST", "/v1/chat/completions",
                                  payload, address=gate.address, timeout=GENERATION_TIMEOUT)
        except health._REQUEST_ERRORS as exc:
            raise gate.fail(f"generation failed: {health._why(exc)}") from None
        if resp.status != 200:
            raise gate.fail(f"generation answered HTTP {resp.status}: {resp.body[:200].decode(errors='replace')}")
        text = health.answer_text(resp)
        usage = (resp.json() or {}).get("usage") or {}
        return text, usage.get("completion_tokens")


def production_unit(session) -> str:
    return unit_name(session.host.service)


def production_state(session) -> tuple[bool, str]:
    """(unit file installed, active state) of the production server."""
    return ask(session, production_state_query(production_unit(session)))


def production_state_query(unit: str) -> Query[tuple[bool, str]]:
    return Query(Cmd.of("bash", "-c", remote.text("unit_installed.sh"), "state", unit), parse_production_state,
                 "production unit", timeout=60, check=True)


def parse_production_state(host: str, output: str) -> tuple[bool, str]:
    """(installed, active state) from unit_installed.sh's two words."""
    words = output.split()
    return (bool(words) and words[0] == "installed", words[1] if len(words) > 1 else "unknown")


def stop_production(prober: HostProber) -> None:
    prober.say(f"stopping {production_unit(prober.session)} for the probe (two servers of this size do not fit)")
    prober.stop(production_unit(prober.session))


def start_production(session) -> None:
    session.run(Cmd.of("systemctl", "start", "--", production_unit(session)), step="start production server",
                timeout=300)
