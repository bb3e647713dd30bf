"""The stand-in nvidia-smi answers in the shapes of the real H200 captures."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpufleet.sim import nvidia_smi

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "real-h200"
QUERY = ("index,name,uuid,pci.bus_id,compute_cap,driver_version,memory.total,memory.used,memory.free,"
         "utilization.gpu,temperature.gpu,power.draw,persistence_mode")
NOUNITS = "index,name,compute_cap,driver_version,memory.total,memory.used"
# The captured H200 box, as a simulated host; its table must come out byte-for-byte.
H200 = {"count": 1, "name": "NVIDIA H200", "compute_cap": "9.0", "driver": "580.159.04", "cuda": "13.0",
        "memory_mib": 143771, "uuid_seed": "h200", "fail": None, "reserved_mib": 615, "temperature_c": 36,
        "power_draw_w": 126.0, "power_limit_w": 700, "pstate": "P0", "bus_ids": ["00000000:00:06.0"],
        "cpu_affinity": ["0-15"]}
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9]$")
BANNER = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ 123]\d \d\d:\d\d:\d\d \d{4} {7}$")


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    """Configure the simulated GPUs of this test: gpus(count=7, ...) or gpus(**H200)."""

    def configure(**cfg) -> Path:
        path = tmp_path / "gpus.json"
        path.write_text(json.dumps(cfg))
        monkeypatch.setenv("GPUFLEET_SIM_GPUS", str(path))
        return path

    return configure


def smi(*args: str) -> str:
    text, rc = nvidia_smi.run(list(args))
    assert rc == 0, text
    return text


def real(name: str) -> str:
    return (REAL / name).read_text()


def shape(value: str) -> str:
    """A value's format with its numbers abstracted: '143771 MiB' and '97887 MiB' have one shape."""
    return re.sub(r"\d+", "9", value)


def test_table_reproduces_the_real_capture_after_its_timestamp(gpus):
    gpus(**H200)
    ours, theirs = smi().splitlines(), real("nvidia-smi.txt").splitlines()
    assert ours[1:] == theirs[1:]
    assert BANNER.match(ours[0]) and BANNER.match(theirs[0])


def test_blackwell_table_keeps_the_real_layout(gpus):
    gpus(count=8, uuid_seed="host1")
    ours, theirs = smi().splitlines(), real("nvidia-smi.txt").splitlines()
    assert ours[3:8] == theirs[3:8]
    assert "Driver Version: 580.95.05" in ours[2] and "CUDA Version: 13.0" in ours[2]
    assert {len(line) for line in ours[1:] if line} == {len(line) for line in theirs[1:] if line}
    rows = [line for line in ours if re.match(r"^\|\s+\d+  NVIDIA", line)]
    assert [int(row.split()[1]) for row in rows] == list(range(8))
    assert all("NVIDIA RTX PRO 6000 Blac...    On  |" in row for row in rows)
    assert re.search(r"\| N/A   \d+C    P\d +\d+W /  600W \| +0MiB /  97887MiB \|", "\n".join(ours))
    assert ours[-2:] == theirs[-2:]


def test_query_gpu_matches_the_real_header_and_value_shapes(gpus):
    gpus(count=8, uuid_seed="host1")
    header, *rows = smi(f"--query-gpu={QUERY}", "--format=csv").splitlines()
    real_header, real_row = real("query-gpu.csv").splitlines()
    assert header == real_header
    assert len(rows) == 8
    theirs = real_row.split(", ")
    for row in rows:
        fields = row.split(", ")
        assert len(fields) == len(theirs)
        assert UUID.match(fields[2]) and UUID.match(theirs[2])
        assert BUS_ID.match(fields[3]) and BUS_ID.match(theirs[3])
        assert fields[4] == "12.0" and fields[1] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
        for index in (0, 4, 5, 6, 7, 8, 9, 10, 11, 12):
            assert shape(fields[index]) == shape(theirs[index]), (fields[index], theirs[index])


def test_query_gpu_noheader_nounits_matches_the_real_shape(gpus):
    gpus(count=8)
    rows = smi(f"--query-gpu={NOUNITS}", "--format=csv,noheader,nounits").splitlines()
    theirs = real("query-gpu-nounits.csv").strip().split(", ")
    assert len(rows) == 8
    for row in rows:
        fields = row.split(", ")
        assert [shape(f) for i, f in enumerate(fields) if i != 1] == [shape(f) for i, f in enumerate(theirs) if i != 1]


def test_query_gpu_nounits_keeps_units_in_the_header(gpus):
    gpus(count=1)
    assert smi("--query-gpu=memory.total,power.draw", "--format=csv,nounits").splitlines() == [
        "memory.total [MiB], power.draw [W]", "97887, 32.41"]


def test_unknown_field_fails_like_the_real_one(gpus):
    gpus(count=8)
    assert nvidia_smi.run(["--query-gpu=index,cuda_version", "--format=csv"]) == (
        'Field "cuda_version" is not a valid field to query.\n\n', 2)


def test_query_compute_apps(gpus):
    gpus(count=8)
    assert smi("--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv") == real("query-apps.csv")
    gpus(count=8, apps=[{"gpu": 3, "pid": 4242, "process_name": "python3", "used_mib": 90112}])
    text = smi("--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv")
    assert text.splitlines()[1] == "4242, python3, 90112 MiB"
    assert "|    3   N/A  N/A            4242      C   python3" in smi()


def test_list_gpus_has_the_real_shape_and_stable_uuids(gpus):
    gpus(count=8, uuid_seed="host1")
    lines = smi("-L").splitlines()
    pattern = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]{36})\)$")
    assert pattern.match(real("nvidia-smi-L.txt").strip())
    matches = [pattern.match(line) for line in lines]
    assert [int(m.group(1)) for m in matches] == list(range(8))
    uuids = [m.group(3) for m in matches]
    assert len(set(uuids)) == 8 and smi("-L").splitlines() == lines
    gpus(count=8, uuid_seed="host2")
    assert not set(uuids) & {pattern.match(line).group(3) for line in smi("-L").splitlines()}


def element_paths(node: ET.Element, prefix: str = "") -> set[str]:
    path = f"{prefix}/{node.tag}"
    return {path}.union(*(element_paths(child, path) for child in node))


def test_xml_is_a_well_formed_subset_of_the_real_one(gpus):
    gpus(count=8, uuid_seed="host1")
    text = smi("-q", "-x")
    assert text.splitlines()[:3] == real("nvidia-smi-q.xml").splitlines()[:3]
    ours, theirs = ET.fromstring(text), ET.fromstring(real("nvidia-smi-q.xml"))
    assert element_paths(ours) <= element_paths(theirs)
    assert ours.findtext("driver_version") == "580.95.05" and ours.findtext("cuda_version") == "13.0"
    assert ours.findtext("attached_gpus") == "8"
    gpu = ours.findall("gpu")[0]
    assert gpu.get("id") == gpu.findtext("pci/pci_bus_id") and BUS_ID.match(gpu.get("id"))
    assert gpu.findtext("product_name") == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert UUID.match(gpu.findtext("uuid"))
    assert shape(gpu.findtext("fb_memory_usage/total")) == shape(theirs.findtext("gpu/fb_memory_usage/total"))
    assert text.endswith("\t</gpu>\n\n</nvidia_smi_log>\n")


def test_query_text_uses_the_580_layout(gpus):
    gpus(count=2)
    lines = smi("-q").splitlines()
    assert lines[:3] == ["", "==============NVSMI LOG==============", ""]
    assert {line.index(" : ") + 1 for line in lines if " : " in line} == {55}
    assert f"{'    Product Name':<55}: NVIDIA RTX PRO 6000 Blackwell Server Edition" in lines
    assert "        Total                                          : 97887 MiB" in lines
    assert sum(line.startswith("GPU 0000") for line in lines) == 2


def test_topology_matches_the_real_capture(gpus):
    gpus(**H200)
    assert smi("topo", "-m") == real("topo.txt")
    gpus(count=8, cpu_affinity=["0-31", "32-63"])
    rows = smi("topo", "-m").splitlines()[1:9]
    assert rows[0].split("\t")[1:10] == [" X ", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS", "0-31"]


def test_seven_gpus_of_capability_nine(gpus):
    gpus(count=7, compute_cap="9.0", name="NVIDIA H200", memory_mib=143771)
    assert len(smi("-L").splitlines()) == 7
    rows = smi("--query-gpu=index,compute_cap,memory.total", "--format=csv,noheader").splitlines()
    assert rows == [f"{i}, 9.0, 143771 MiB" for i in range(7)]
    assert smi().count("NVIDIA H200") == 7
    assert ET.fromstring(smi("-q", "-x")).findtext("attached_gpus") == "7"
    assert smi("-i", "3", "--query-gpu=index", "--format=csv,noheader") == "3\n"


def test_driver_failure_prints_the_real_text_and_exits_9(gpus, monkeypatch, tmp_path):
    gpus(count=8, fail="driver not loaded")
    text, rc = nvidia_smi.run([])
    assert rc == 9 and text.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    assert nvidia_smi.run(["--query-gpu=index", "--format=csv"])[1] == 9
    monkeypatch.setenv("GPUFLEET_SIM_GPUS", str(tmp_path / "absent.json"))
    assert nvidia_smi.run(["-L"])[1] == 9


def imported_modules(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module.split(".")[0])
    return names


def test_the_script_runs_standalone_with_the_stdlib_only(gpus):
    path = gpus(count=2)
    source = Path(nvidia_smi.__file__).read_text()
    assert source.startswith("#!/usr/bin/env python3\n")
    assert imported_modules(source) <= set(sys.stdlib_module_names)
    env = {**os.environ, "GPUFLEET_SIM_GPUS": str(path)}
    proc = subprocess.run([sys.executable, nvidia_smi.__file__, "-L"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2
    failing = subprocess.run([sys.executable, nvidia_smi.__file__, "--bogus"], env=env, capture_output=True, text=True)
    assert failing.returncode == 2


def test_driver_version_file_has_the_real_drivers_shape():
    """The stand-in driver's /proc/driver/nvidia/version: the real H200's two lines, the driver version in its place."""
    real = next(p for p in (REAL / "system.txt").read_text().split("---\n") if p.startswith("NVRM"))
    sim = nvidia_smi.module_text(H200)
    shape = re.compile(r"^NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  (\S+)  Release Build  \(.*\)  \n"
                       r"GCC version:  gcc version .* \n$")
    assert shape.match(real)[1] == shape.match(sim)[1] == "580.159.04"
    assert nvidia_smi.module_text({**H200, "cuda": "13.1"}) != sim  # another CUDA is another driver build
    assert nvidia_smi.module_text({**H200, "fail": "driver"}) is None  # no module loaded
