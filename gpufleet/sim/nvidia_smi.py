#!/usr/bin/env python3
"""Stand-in nvidia-smi: answers from /etc/gpufleet-sim/gpus.json in the real driver 580 output formats."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

CONFIG_PATH = "/etc/gpufleet-sim/gpus.json"
DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"
DEFAULTS = {
    "count": 8,
    "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "compute_cap": "12.0",
    "driver": "580.95.05",
    "cuda": "13.0",
    "memory_mib": 97887,
    "uuid_seed": "gpufleet-sim",
    "fail": None,
    "reserved_mib": 529,
    "temperature_c": 31,
    "power_draw_w": 32.41,
    "power_limit_w": 600,
    "pstate": "P8",
    "persistence": "Enabled",
    "ecc": "0",
    "utilization_gpu": 0,
    "cpu_affinity": None,
    "bus_ids": None,
    "apps": [],
}
ARCHITECTURES = {"7": "Volta", "8": "Ampere", "8.9": "Ada Lovelace", "9": "Hopper", "10": "Blackwell",
                 "12": "Blackwell"}
SEPARATOR = "+-----------------------------------------+------------------------+----------------------+"
WIDE_SEPARATOR = "+" + "-" * 89 + "+"


def load_config() -> dict:
    path = os.environ.get("GPUFLEET_SIM_GPUS", CONFIG_PATH)
    try:
        with open(path) as handle:
            loaded = json.load(handle)
    except FileNotFoundError:
        # A host without the simulated driver behaves like one whose driver is not loaded.
        loaded = {"fail": "no /etc/gpufleet-sim/gpus.json"}
    return {**DEFAULTS, **{k: v for k, v in loaded.items() if v is not None or k == "fail"}}


def gpu_uuid(seed: str, index: int) -> str:
    digest = hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def bus_id(cfg: dict, index: int) -> str:
    if cfg["bus_ids"]:
        return cfg["bus_ids"][index]
    return f"{index // 8:08X}:{(index % 8) * 0x20 + 1:02X}:00.0"


def architecture(compute_cap: str) -> str:
    return ARCHITECTURES.get(compute_cap[:3], ARCHITECTURES.get(compute_cap.split(".")[0], "Unknown"))


def gpus(cfg: dict) -> list[dict]:
    return [gpu(cfg, index) for index in range(int(cfg["count"]))]


def gpu(cfg: dict, index: int) -> dict:
    apps = [app for app in cfg["apps"] if int(app.get("gpu", 0)) == index]
    used = sum(int(app.get("used_mib", 0)) for app in apps)
    total = int(cfg["memory_mib"])
    return {
        "index": index,
        "name": cfg["name"],
        "uuid": gpu_uuid(str(cfg["uuid_seed"]), index),
        "bus_id": bus_id(cfg, index),
        "compute_cap": str(cfg["compute_cap"]),
        "total": total,
        "reserved": int(cfg["reserved_mib"]),
        "used": used,
        "free": total - int(cfg["reserved_mib"]) - used,
        "util": int(cfg["utilization_gpu"]),
        "temp": int(cfg["temperature_c"]),
        "draw": float(cfg["power_draw_w"]),
        "limit": float(cfg["power_limit_w"]),
        "pstate": cfg["pstate"],
        "persistence": cfg["persistence"],
        "ecc": str(cfg["ecc"]),
        "apps": apps,
    }


# field -> (unit, value); aliases map to the canonical name the header shows.
FIELDS = {
    "timestamp": (None, lambda c, g: timestamp_csv()),
    "driver_version": (None, lambda c, g: c["driver"]),
    "count": (None, lambda c, g: str(c["count"])),
    "index": (None, lambda c, g: str(g["index"])),
    "name": (None, lambda c, g: g["name"]),
    "uuid": (None, lambda c, g: g["uuid"]),
    "serial": (None, lambda c, g: str(1650000000000 + g["index"])),
    "pci.bus_id": (None, lambda c, g: g["bus_id"]),
    "compute_cap": (None, lambda c, g: g["compute_cap"]),
    "persistence_mode": (None, lambda c, g: g["persistence"]),
    "pstate": (None, lambda c, g: g["pstate"]),
    "compute_mode": (None, lambda c, g: "Default"),
    "mig.mode.current": (None, lambda c, g: "Disabled"),
    "fan.speed": ("%", lambda c, g: "[N/A]"),
    "memory.total": ("MiB", lambda c, g: g["total"]),
    "memory.reserved": ("MiB", lambda c, g: g["reserved"]),
    "memory.used": ("MiB", lambda c, g: g["used"]),
    "memory.free": ("MiB", lambda c, g: g["free"]),
    "utilization.gpu": ("%", lambda c, g: g["util"]),
    "utilization.memory": ("%", lambda c, g: 0),
    "temperature.gpu": (None, lambda c, g: str(g["temp"])),
    "power.draw": ("W", lambda c, g: g["draw"]),
    "power.limit": ("W", lambda c, g: g["limit"]),
}
ALIASES = {
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "gpu_serial": "serial",
    "enforced.power.limit": "power.limit",
    "power.draw.instant": "power.draw",
}
APP_FIELDS = {
    "pid": (None, lambda g, a: str(a.get("pid", 0))),
    "process_name": (None, lambda g, a: a.get("process_name", "python3")),
    "used_gpu_memory": ("MiB", lambda g, a: int(a.get("used_mib", 0))),
    "used_memory": ("MiB", lambda g, a: int(a.get("used_mib", 0))),
    "gpu_uuid": (None, lambda g, a: g["uuid"]),
    "gpu_bus_id": (None, lambda g, a: g["bus_id"]),
}


def timestamp_csv() -> str:
    now = time.localtime()
    return time.strftime("%Y/%m/%d %H:%M:%S.000", now)


def timestamp_banner() -> str:
    now = time.localtime()
    return f"{time.strftime('%a %b', now)} {now.tm_mday:>2} {time.strftime('%H:%M:%S %Y', now)}"


def render_value(unit: str | None, value, units: bool) -> str:
    if isinstance(value, str) or unit is None:
        return str(value)
    text = f"{value:.2f}" if unit == "W" else str(value)
    return f"{text} {unit}" if units else text


def header_name(name: str, unit: str | None) -> str:
    return f"{name} [{unit}]" if unit else name


def csv_table(rows: list[list[str]], header: list[str] | None) -> str:
    lines = ([", ".join(header)] if header is not None else []) + [", ".join(row) for row in rows]
    return "".join(line + "\n" for line in lines)


def parse_format(fmt: str | None) -> tuple[bool, bool] | None:
    if fmt is None:
        return None
    opts = [part.strip() for part in fmt.split(",")]
    if opts[0] != "csv" or any(opt not in ("csv", "noheader", "nounits") for opt in opts):
        return None
    return "noheader" not in opts, "nounits" not in opts


def query_gpu(cfg: dict, selected: list[dict], fields: list[str], header: bool, units: bool) -> tuple[str, int]:
    canonical = [ALIASES.get(field, field) for field in fields]
    for field, name in zip(fields, canonical):
        if name not in FIELDS:
            return f'Field "{field}" is not a valid field to query.\n\n', 2
    specs = [(name, *FIELDS[name]) for name in canonical]
    rows = [[render_value(unit, fn(cfg, g), units) for _, unit, fn in specs] for g in selected]
    return csv_table(rows, [header_name(name, unit) for name, unit, _ in specs] if header else None), 0


def query_apps(selected: list[dict], fields: list[str], header: bool, units: bool) -> tuple[str, int]:
    for field in fields:
        if field not in APP_FIELDS:
            return f'Field "{field}" is not a valid field to query.\n\n', 2
    apps = [(g, app) for g in selected for app in g["apps"]]
    rows = [[render_value(APP_FIELDS[f][0], APP_FIELDS[f][1](g, app), units) for f in fields] for g, app in apps]
    return csv_table(rows, [header_name(f, APP_FIELDS[f][0]) for f in fields] if header else None), 0


def list_gpus(selected: list[dict]) -> str:
    return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in selected)


def short_name(name: str) -> str:
    return name if len(name) <= 27 else name[:24] + "..."


def table_gpu_block(g: dict) -> list[str]:
    on = "On" if g["persistence"] == "Enabled" else "Off"
    power = f"{round(g['draw'])}W / {round(g['limit']):>4}W"
    return [
        f"|{g['index']:>4}  {short_name(g['name']):<28} {on:>4}  |{g['bus_id']:>19} Off |{g['ecc']:>21} |",
        f"| N/A  {g['temp']:>3}C    {g['pstate']:>2}  {power:>22} |"
        f"{g['used']:>8}MiB / {g['total']:>6}MiB |{g['util']:>7}%{'Default':>13} |",
        f"|{'':41}|{'':24}|{'Disabled':>21} |",
        SEPARATOR,
    ]


def process_name(name: str) -> str:
    return name if len(name) <= 32 else "..." + name[-29:]


def table_processes(selected: list[dict]) -> list[str]:
    apps = [(g["index"], app) for g in selected for app in g["apps"]]
    rows = [
        f"|{index:>5}   N/A  N/A{app.get('pid', 0):>16}{'C':>7}   "
        f"{process_name(app.get('process_name', 'python3')):<32}{str(app.get('used_mib', 0)) + 'MiB':>14} |"
        for index, app in apps
    ]
    return rows or ["|  No running processes found" + " " * 61 + "|"]


def table(cfg: dict, selected: list[dict]) -> str:
    head = f"| NVIDIA-SMI {cfg['driver']:<22} Driver Version: {cfg['driver']:<14} CUDA Version: {cfg['cuda']:<9}|"
    lines = [
        timestamp_banner() + "       ",
        WIDE_SEPARATOR,
        head,
        SEPARATOR,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
    ]
    for g in selected:
        lines += table_gpu_block(g)
    lines += [
        "",
        WIDE_SEPARATOR,
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * 89 + "|",
        *table_processes(selected),
        WIDE_SEPARATOR,
    ]
    return "".join(line + "\n" for line in lines)


def pci_parts(bus_id: str) -> tuple[str, str, str]:
    """Domain, bus and device of a bus id such as 00000000:01:00.0 (as the short forms nvidia-smi prints)."""
    domain, bus, device = bus_id.split(":")
    return domain[4:], bus, device.split(".")[0]


def kv(label: str, value, depth: int = 0) -> str:
    return f"{'    ' * depth + label:<55}: {value}\n"


def query_text_gpu(g: dict) -> str:
    domain, bus, device = pci_parts(g["bus_id"])
    return (
        f"GPU {g['bus_id']}\n"
        + kv("Product Name", g["name"], 1)
        + kv("Product Brand", "NVIDIA", 1)
        + kv("Product Architecture", architecture(g["compute_cap"]), 1)
        + kv("Persistence Mode", g["persistence"], 1)
        + kv("GPU UUID", g["uuid"], 1)
        + kv("Minor Number", g["index"], 1)
        + "    PCI\n"
        + kv("Bus", f"0x{bus}", 2)
        + kv("Device", f"0x{device}", 2)
        + kv("Domain", f"0x{domain}", 2)
        + kv("Bus Id", g["bus_id"], 2)
        + "    FB Memory Usage\n"
        + kv("Total", f"{g['total']} MiB", 2)
        + kv("Reserved", f"{g['reserved']} MiB", 2)
        + kv("Used", f"{g['used']} MiB", 2)
        + kv("Free", f"{g['free']} MiB", 2)
        + kv("Compute Mode", "Default", 1)
        + "    Utilization\n"
        + kv("GPU", f"{g['util']} %", 2)
        + kv("Memory", "0 %", 2)
        + "    Temperature\n"
        + kv("GPU Current Temp", f"{g['temp']} C", 2)
        + "    GPU Power Readings\n"
        + kv("Instant Power Draw", f"{g['draw']:.2f} W", 2)
        + kv("Current Power Limit", f"{g['limit']:.2f} W", 2)
        + "\n"
    )


def query_text(cfg: dict, selected: list[dict]) -> str:
    head = (
        "\n==============NVSMI LOG==============\n\n"
        + kv("Timestamp", timestamp_banner())
        + kv("Driver Version", cfg["driver"])
        + kv("CUDA Version", cfg["cuda"])
        + "\n"
        + kv("Attached GPUs", cfg["count"])
    )
    return head + "".join(query_text_gpu(g) for g in selected)


def xml_escape(value) -> str:
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def xml_lines(tree: list, depth: int) -> list[str]:
    lines = []
    for tag, value in tree:
        pad = "\t" * depth
        if isinstance(value, list):
            lines += [f"{pad}<{tag}>", *xml_lines(value, depth + 1), f"{pad}</{tag}>"]
        else:
            lines.append(f"{pad}<{tag}>{xml_escape(value)}</{tag}>")
    return lines


def xml_gpu_tree(g: dict) -> list:
    domain, bus, device = pci_parts(g["bus_id"])
    return [
        ("product_name", g["name"]),
        ("product_brand", "NVIDIA"),
        ("product_architecture", architecture(g["compute_cap"])),
        ("persistence_mode", g["persistence"]),
        ("uuid", g["uuid"]),
        ("minor_number", g["index"]),
        ("pci", [("pci_bus", bus), ("pci_device", device), ("pci_domain", domain),
                 ("pci_bus_id", g["bus_id"])]),
        ("fb_memory_usage", [(k, f"{g[k]} MiB") for k in ("total", "reserved", "used", "free")]),
        ("compute_mode", "Default"),
        ("utilization", [("gpu_util", f"{g['util']} %"), ("memory_util", "0 %")]),
        ("temperature", [("gpu_temp", f"{g['temp']} C")]),
        ("gpu_power_readings", [("power_state", g["pstate"]), ("instant_power_draw", f"{g['draw']:.2f} W"),
                                ("current_power_limit", f"{g['limit']:.2f} W")]),
    ]


def query_xml(cfg: dict, selected: list[dict]) -> str:
    lines = [
        '<?xml version="1.0" ?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">',
        "<nvidia_smi_log>",
        *xml_lines([("timestamp", timestamp_banner()), ("driver_version", cfg["driver"]),
                    ("cuda_version", cfg["cuda"]), ("attached_gpus", cfg["count"])], 1),
    ]
    for g in selected:
        lines += [f'\t<gpu id="{g["bus_id"]}">', *xml_lines(xml_gpu_tree(g), 2), "\t\t<processes>", "\t\t</processes>",
                  "\t</gpu>", ""]
    return "\n".join(lines + ["</nvidia_smi_log>", ""])


def topo(cfg: dict, selected: list[dict]) -> str:
    count = len(selected)
    half = max(1, (count + 1) // 2)
    cpus = cfg["cpu_affinity"] or [f"0-{os.cpu_count() - 1}"] * 2
    names = [f"GPU{g['index']}" for g in selected]
    lines = ["\t\x1b[4m" + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"]
    for i, name in enumerate(names):
        links = [" X " if i == j else ("NODE" if i // half == j // half else "SYS") for j in range(count)]
        numa = i // half if count > 1 else 0
        lines.append("\t".join([name, *links, cpus[numa % len(cpus)], str(numa), "", "N/A"]))
    return "\n".join(lines) + "\n" + TOPO_LEGEND


TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def version_text(cfg: dict) -> str:
    nvml = ".".join(cfg["driver"].split(".")[:2])
    return (f"NVIDIA-SMI version  : {cfg['driver']}\nNVML version        : {nvml}\n"
            f"DRIVER version      : {cfg['driver']}\nCUDA Version        : {cfg['cuda']}\n")


def parse_args(argv: list[str]) -> dict | None:
    opts: dict = {"mode": "table"}
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")
        if key in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id", "-d", "--display") and not eq:
            if not args:
                return None
            value = args.pop(0)
        if key in ("--query-gpu", "--query-compute-apps"):
            opts["mode"], opts["fields"] = key[8:], [f.strip() for f in value.split(",") if f.strip()]
        elif key == "--format":
            opts["format"] = value
        elif key in ("-i", "--id"):
            opts["ids"] = value
        elif key in ("-L", "--list-gpus"):
            opts["mode"] = "list"
        elif key in ("-q", "--query"):
            opts["mode"] = "xml" if opts.get("xml") else "query"
        elif key in ("-x", "--xml-format"):
            opts["xml"] = True
            opts["mode"] = "xml" if opts["mode"] == "query" else opts["mode"]
        elif key == "--version":
            opts["mode"] = "version"
        elif key == "topo" and args[:1] == ["-m"]:
            args.pop(0)
            opts["mode"] = "topo"
        elif key not in ("-d", "--display"):
            return None
    return opts


def select(all_gpus: list[dict], ids: str | None) -> list[dict] | None:
    if ids is None:
        return all_gpus
    chosen = []
    for ident in ids.split(","):
        match = [g for g in all_gpus if ident.strip() in (str(g["index"]), g["uuid"], g["bus_id"])]
        if not match:
            return None
        chosen += match
    return chosen


def module_text(cfg: dict) -> str | None:
    """What the driver's /proc/driver/nvidia/version says for this config, in driver 580's form (as on the real H200:
    tests/fixtures/real-h200/system.txt); None while it `fail`s, as with no kernel module loaded."""
    if cfg.get("fail"):
        return None
    return (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {cfg['driver']}  Release Build  "
            f"(gpufleet-sim, CUDA {cfg['cuda']})  \nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n")


def run(argv: list[str]) -> tuple[str, int]:
    cfg = load_config()
    opts = parse_args(argv)
    if opts is None:
        return BAD_ARGS, 2
    if opts["mode"] == "version":
        return version_text(cfg), 0
    if cfg["fail"]:
        return DRIVER_FAILURE, 9
    if int(cfg["count"]) == 0:
        return "No devices were found\n", 6
    selected = select(gpus(cfg), opts.get("ids"))
    if selected is None:
        return f"No devices were found matching the id {opts['ids']}.\n", 6
    return dispatch(cfg, opts, selected)


def dispatch(cfg: dict, opts: dict, selected: list[dict]) -> tuple[str, int]:
    mode = opts["mode"]
    if mode in ("gpu", "compute-apps"):
        fmt = parse_format(opts.get("format"))
        if fmt is None:
            return "'--format=' switch is missing or invalid. Please run 'nvidia-smi -h' for help.\n\n", 2
        if mode == "gpu":
            return query_gpu(cfg, selected, opts["fields"], *fmt)
        return query_apps(selected, opts["fields"], *fmt)
    renderers = {"list": lambda: list_gpus(selected), "query": lambda: query_text(cfg, selected),
                 "xml": lambda: query_xml(cfg, selected), "topo": lambda: topo(cfg, selected),
                 "table": lambda: table(cfg, selected)}
    return renderers[mode](), 0


def main(argv: list[str] | None = None) -> int:
    text, rc = run(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(text)
    sys.stdout.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main())
