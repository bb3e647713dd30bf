"""Model files on a host: one remote check (config.json, every shard the index names, each shard's size), download."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from gpufleet import remote
from gpufleet.engine.command import Cmd, Part
from gpufleet.engine.query import Query
from gpufleet.errors import FactError

MARKER = "@@gpufleet-model "
INDEX = "model.safetensors.index.json"

CHECK = remote.text("model_check.py")  # argv: model dir, report|verify|needed


@dataclass
class ModelReport:
    """What the check found in a model directory."""

    dir: str
    exists: bool
    config: bool
    index: bool = False
    shards: int = 0
    bytes: int = 0
    missing: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        """One phrase per kind of problem, naming the files."""
        if not self.exists:
            return [f"{self.dir} does not exist"]
        found = [] if self.config else ["config.json missing"]
        if self.error:
            found.append(self.error)
        if self.missing:
            found.append(f"{len(self.missing)} shard(s) missing: {', '.join(self.missing)}")
        if self.empty:
            found.append(f"{len(self.empty)} shard(s) empty: {', '.join(self.empty)}")
        found += [f"shard {name} is damaged: {why}" for name, why in self.bad]
        return found

    def summary(self) -> str:
        return f"config.json, {self.shards} shard(s), {_size(self.bytes)}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n:.1f} TiB"


def check_cmd(model_path: str, python: str, mode: str = "report") -> Cmd:
    """The one remote command checking a model directory (python: the host's venv interpreter). The check is stdlib
    only: -S skips site (the venv's .pth files and editable finders, a third of its CPU), -E the PYTHON* variables."""
    return Cmd.of(python, "-E", "-S", "-c", CHECK, model_path, mode, cwd="/")


_REMEMBERED = remote.text("host_cache.sh") + remote.text("model_memo.sh")


def report_cmd(model_path: str, python: str) -> Cmd:
    """check_cmd's report, answered from the host's memo while the directory's entries are unchanged (model_memo.sh):
    parsing a large checkpoint's headers costs the host more than everything else a plan reads."""
    digest = hashlib.sha256(CHECK.encode()).hexdigest()
    return Cmd.of("bash", "-c", _REMEMBERED, "model-check", model_path, python, CHECK, digest)


def model_query(model_path: str, python: str) -> Query[ModelReport]:
    """The report on a model directory (report_cmd), parsed."""
    return Query(report_cmd(model_path, python), lambda host, output: parse_report(output, host), "model files")


def parse_report(text: str, host: str | None = None) -> ModelReport:
    """The report line of check_cmd's output; FactError when there is none (no python, crash)."""
    for line in reversed(text.splitlines()):
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER):])
                return ModelReport(dir=data["dir"], exists=data["exists"], config=data["config"],
                                   index=data.get("index", False), shards=data.get("shards", 0),
                                   bytes=data.get("bytes", 0), missing=list(data.get("missing", [])),
                                   empty=list(data.get("empty", [])),
                                   bad=[tuple(b) for b in data.get("bad", [])], error=data.get("error"))
            except (ValueError, KeyError, TypeError) as exc:
                raise FactError("model files", host, f"bad report line ({exc})") from None
    tail = " | ".join(text.strip().splitlines()[-3:]) or "no output"
    raise FactError("model files", host, f"the check printed no report: {tail}")


def download_cmd(model: str, model_path: str, venv: str, env: dict[str, Part] | None = None) -> Cmd:
    """Download a hub model into model_path with the Hugging Face CLI (venv's first); env may carry HF_TOKEN."""
    return Cmd.of("bash", "-c", remote.text("model_download.sh"), "download", model, model_path, venv,
                  env=env or None, cwd="/")
