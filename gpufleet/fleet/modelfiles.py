"""Model files on a host: one remote check (config.json, every shard the index names, each shard's size), download."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gpufleet.engine.command import Cmd, Part, script
from gpufleet.errors import FactError

MARKER = "@@gpufleet-model "
INDEX = "model.safetensors.index.json"

# argv: model dir, mode. report: print the JSON report, exit 0. verify: exit 0 only when complete.
# needed: exit 0 while incomplete (a download is still needed), 1 once complete.
# A shard's expected size comes from its own safetensors header: 8 + header length + the end of the last tensor.
CHECK = r'''
import json, os, struct, sys
d, mode = sys.argv[1], sys.argv[2]
r = {"dir": d, "exists": os.path.isdir(d), "config": False, "index": False, "shards": 0, "bytes": 0,
     "missing": [], "empty": [], "bad": [], "error": None}
def expected_size(path, size):
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return None
        n = struct.unpack("<Q", head)[0]
        if n > min(size - 8, 100 * 2 ** 20):
            return None
        header = json.loads(f.read(n))
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    return 8 + n + max(ends, default=0)
names = []
if r["exists"]:
    r["config"] = os.path.isfile(os.path.join(d, "config.json"))
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.isfile(index):
        r["index"] = True
        try:
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except Exception as e:
            r["error"] = "unreadable model.safetensors.index.json (%s: %s)" % (type(e).__name__, e)
    elif os.path.isfile(os.path.join(d, "model.safetensors")):
        names = ["model.safetensors"]
    else:
        r["error"] = "neither model.safetensors.index.json nor model.safetensors is there"
for name in names:
    path = os.path.join(d, name)
    try:
        size = os.stat(path).st_size
    except OSError:
        r["missing"].append(name)
        continue
    if size == 0:
        r["empty"].append(name)
        continue
    r["shards"] += 1
    r["bytes"] += size
    try:
        want = expected_size(path, size)
    except Exception:
        want = None
    if want is None:
        r["bad"].append([name, "unreadable safetensors header"])
    elif want != size:
        r["bad"].append([name, "%d bytes, its header says %d" % (size, want)])
ok = r["exists"] and r["config"] and not r["error"] and not (r["missing"] or r["empty"] or r["bad"])
print("@@gpufleet-model " + json.dumps(r, sort_keys=True))
if mode == "verify":
    sys.exit(0 if ok else 1)
if mode == "needed":
    sys.exit(1 if ok else 0)
'''


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
    """The one remote command checking a model directory (python: the host's venv interpreter)."""
    return Cmd.of(python, "-c", CHECK, model_path, mode, cwd="/")


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


_DOWNLOAD = r'''
set -e
model=$1 dir=$2 venv=$3
mkdir -p -- "$dir"
for tool in "$venv/bin/hf" "$(command -v hf || true)"; do
    if [ -n "$tool" ] && [ -x "$tool" ]; then exec "$tool" download "$model" --local-dir "$dir"; fi
done
for tool in "$venv/bin/huggingface-cli" "$(command -v huggingface-cli || true)"; do
    if [ -n "$tool" ] && [ -x "$tool" ]; then exec "$tool" download "$model" --local-dir "$dir"; fi
done
echo "neither hf nor huggingface-cli found (pip install -U huggingface_hub in $venv)"
exit 127
'''


def download_cmd(model: str, model_path: str, venv: str, env: dict[str, Part] | None = None) -> Cmd:
    """Download a hub model into model_path with the Hugging Face CLI (venv's first); env may carry HF_TOKEN."""
    base = script(_DOWNLOAD)
    return Cmd.of(*base.argv, "download", model, model_path, venv, env=env or None, cwd="/")
