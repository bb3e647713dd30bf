"""What the plan's model-file read costs a host: the check afresh against the report remembered on the host (issue 13).

  python3 bench/model_check_cost.py [--runs 5] [--shards 48] [--dir /var/tmp/gpufleet-bench-model]

Builds (once, kept) a model directory shaped like Qwen3.5-397B-A17B-NVFP4's checkpoint, as its model card gives it:
60 layers of 512 routed experts, each expert's gate, up and down projections with the four tensors an NVFP4 linear
layer has (weight, weight_scale, weight_scale_2, input_scale), plus each layer's attention, router, norms and shared
expert; the safetensors headers and the index name them all. Shards are sparse files of the size their headers
give: the headers are real, the weights are holes (no disk used for them). Then runs the command the plan sends
(facts/modelfiles.report_cmd) with a private host cache: once to fill it, then N times afresh (cache emptied before
each) and N times remembered, and prints the medians of wall and CPU time and their ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpufleet.facts import modelfiles  # noqa: E402

ROUTED = ("weight", "weight_scale", "weight_scale_2", "input_scale")
DENSE = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
         "mlp.gate.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
         "mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
         "mlp.shared_expert.down_proj.weight")


def tensors() -> list[tuple[str, str, list[int], int]]:
    """(name, dtype, shape, bytes) of every tensor, in checkpoint order (byte sizes scaled down: holes anyway)."""
    found = []
    for layer in range(60):
        prefix = f"model.language_model.layers.{layer}"
        for expert in range(512):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                for kind in ROUTED:
                    weight = kind == "weight"
                    found.append((f"{prefix}.mlp.experts.{expert}.{proj}.{kind}", "U8" if weight else "F32",
                                  [1024, 2048] if weight else [1], 1 << 20 if weight else 4))
        found += [(f"{prefix}.{name}", "BF16", [4096, 4096], 1 << 25) for name in DENSE]
    return found


def build(root: Path, shards: int) -> None:
    if (root / "config.json").exists():
        return
    root.mkdir(parents=True, exist_ok=True)
    every = tensors()
    per = -(-len(every) // shards)
    weight_map = {}
    for n in range(shards):
        name = f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for tensor, dtype, shape, size in every[n * per:(n + 1) * per]:
            header[tensor] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[tensor] = name
        text = json.dumps(header).encode()
        with open(root / name, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            f.truncate(8 + len(text) + offset)
    (root / modelfiles.INDEX).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    (root / "config.json").write_text("{}")


def header_length(shard: Path) -> int:
    with shard.open("rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def timed(argv: list[str], env: dict) -> tuple[float, float]:
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or modelfiles.MARKER not in proc.stdout:
        sys.exit(f"the model check failed ({proc.returncode}): {proc.stdout[-500:]}{proc.stderr[-500:]}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shards", type=int, default=48)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/gpufleet-bench-model"))
    args = parser.parse_args()
    build(args.dir, args.shards)
    headers = sum(header_length(p) for p in args.dir.glob("*.safetensors"))
    index = (args.dir / modelfiles.INDEX).stat().st_size
    argv = ["bash", "-c", modelfiles.report_cmd(str(args.dir), sys.executable).render()]
    cache = Path(tempfile.mkdtemp(prefix="gpufleet-bench-cache-"))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "GPUFLEET_HOST_CACHE": str(cache)}
    try:
        fresh = []
        for _ in range(args.runs):
            shutil.rmtree(cache / "model-checks", ignore_errors=True)
            fresh.append(timed(argv, env))
        kept = [timed(argv, env) for _ in range(args.runs)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"model directory {args.dir}: {len(tensors())} tensors in {args.shards} shards, "
          f"{headers / 1e6:.1f} MB of headers, {index / 1e6:.1f} MB index")
    print("| the plan's model-file read | wall (median) | CPU (median) |\n|---|---|---|")
    for label, runs in (("checked afresh", fresh), ("remembered on the host", kept)):
        wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
        print(f"| {label} | {wall:.3f} s | {cpu:.3f} s |")
    ratio = statistics.median(c for _, c in fresh) / max(statistics.median(c for _, c in kept), 1e-6)
    print(f"remembered: {ratio:.0f}x less CPU")


if __name__ == "__main__":
    main()
