"""gpufleet's parsers and status comparison on what the engine really received from an H200 server over real SSH.

The fixtures in tests/fixtures/real-h200-ssh/ were captured on 2026-12-02 by scripts/real-gpu-check.sh on one
NVIDIA H200 (driver 580.159.04, CUDA 13.0, Ubuntu 24.04.3, no systemd): `inv facts`/`inv status` and
gather_facts + TORCH_REPORT through HostSession, against OpenSSH 9.6p1 on 127.0.0.1:2222. See its README.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.facts import (SECTIONS, HostFacts, parse_facts, parse_gpu_query, parse_nvcc, parse_sections,
                            parse_smi_header, parse_smi_list, parse_torch_report)
from gpufleet.config.inventory import GpuExpectation, load_inventory
from gpufleet.config.stack import load_stack
from gpufleet.fleet.status import compare
from gpufleet.remote.versions import versions_match

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real-h200-ssh"
REPO = Path(__file__).resolve().parents[2]

GPU_NAME = "NVIDIA H200"
GPU_UUID = "GPU-c94eabb3-0205-23d6-d499-8b19cfae82df"
BUS_ID = "00000000:00:06.0"
DRIVER = "580.159.04"
MEMORY_MIB = 143771


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture(scope="module")
def facts() -> HostFacts:
    return parse_facts("h200", read("facts-raw.txt"))


@pytest.fixture(scope="module")
def h200():
    return load_inventory(FIXTURES / "h200.toml").hosts["h200"]


def test_every_section_came_back_over_ssh_and_exited_0():
    sections = parse_sections(read("facts-raw.txt"))
    assert set(sections) == set(SECTIONS)
    assert {name: s.rc for name, s in sections.items()} == {name: 0 for name in SECTIONS}


def test_gpus(facts):
    g = facts.gpus
    assert g is not None and len(g.gpus) == 1
    gpu = g.gpus[0]
    assert (gpu.index, gpu.name, gpu.uuid, gpu.pci_bus_id) == (0, GPU_NAME, GPU_UUID, BUS_ID)
    assert gpu.compute_capability == "9.0"
    assert gpu.memory_total_mib == MEMORY_MIB
    assert gpu.driver_version == DRIVER
    assert (g.driver_version, g.cuda_version) == (DRIVER, "13.0")


def test_system(facts):
    assert facts.os is not None
    assert (facts.os.pretty_name, facts.os.id, facts.os.version_id) == ("Ubuntu 24.04.3 LTS", "ubuntu", "24.04")
    assert (facts.os.kernel, facts.os.arch) == ("6.18.44-fc-v973-gpu", "x86_64")
    assert facts.cpu_count == 16
    assert facts.mem_total_bytes == 131961788 * 1024
    assert facts.mem_available_bytes == 131398704 * 1024
    assert facts.nvcc_version == "13.0.88"
    assert facts.python_version == "3.12.3"
    assert [d.path for d in facts.disks] == ["/opt/torch/.venv", "/root/sglang-main", "/models/none", "/tmp"]
    assert {(d.mount, d.total_bytes, d.free_bytes) for d in facts.disks} == {("/", 270553174016, 68640337920)}


def test_packages_of_the_venv(facts):
    pk = facts.packages
    assert pk is not None and len(pk) == 197
    # pip reports torch without its +cu130 label; the probe below has it
    assert (pk["torch"], pk["triton"], pk["pip"]) == ("2.11.0", "3.6.0", "24.0")
    for absent in ("sglang", "sgl-kernel", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"):
        assert absent not in pk
    assert facts.editables == {}


def test_absent_checkout_and_no_systemd_are_values_not_problems(facts):
    assert facts.problems == []
    co = facts.checkout
    assert (co.path, co.present, co.exists, co.head, co.branch) == ("/root/sglang-main", False, False, None, None)
    u = facts.unit
    assert (u.systemd, u.present, u.path, u.sha256) == (False, False, None, None)


def test_engine_facts_match_what_inv_facts_printed(facts):
    printed = json.loads(read("inv-facts.json"))
    parsed = facts.model_dump(mode="json")
    for key in ("host", "gpus", "os", "cpu_count", "nvcc_version", "python_version", "packages", "problems"):
        assert parsed[key] == printed[key], key
    # two facts runs seconds apart: only MemAvailable and the free disk space moved, a little
    assert parsed["mem_total_bytes"] == printed["mem_total_bytes"]
    assert abs(parsed["mem_available_bytes"] - printed["mem_available_bytes"]) < 2**30
    assert [(d["path"], d["mount"], d["total_bytes"]) for d in parsed["disks"]] == \
        [(d["path"], d["mount"], d["total_bytes"]) for d in printed["disks"]]
    assert all(abs(a["free_bytes"] - b["free_bytes"]) < 2**30 for a, b in zip(parsed["disks"], printed["disks"]))
    for key in ("path", "present", "exists"):
        assert parsed["checkout"][key] == printed["checkout"][key]


def test_inv_facts_table():
    table = read("inv-facts.txt")
    for text in ("1 x NVIDIA H200 (cc 9.0, 143771 MiB)", "580.159.04 / 13.0", "Ubuntu 24.04.3 LTS", "13.0.88",
                 "3.12.3", "no systemd"):
        assert text in table


def test_nvidia_smi_run_directly_agrees_with_the_facts_over_ssh(facts):
    direct = parse_gpu_query(read("nvidia-smi-query.csv"), "h200")
    assert direct == facts.gpus.gpus
    sections = parse_sections(read("facts-raw.txt"))
    assert sections["gpu-query"].text == read("nvidia-smi-query.csv")
    header = parse_smi_header(read("nvidia-smi.txt"), "h200")
    assert (header.driver_version, header.cuda_version) == (DRIVER, "13.0")
    listing = parse_smi_list(read("nvidia-smi-L.txt"), "h200")
    assert [(g.index, g.name, g.uuid) for g in listing] == [(0, GPU_NAME, GPU_UUID)]
    assert parse_nvcc(read("nvcc-version.txt"), "h200") == "13.0.88"
    assert "nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,compute_cap,driver_version,memory.total " \
           "--format=csv,noheader,nounits" in read("nvidia-smi-commands.txt")


def test_torch_probe_through_the_ssh_session():
    r = parse_torch_report(read("torch-probe.txt"), "h200")
    assert (r.version, r.cuda, r.available, r.device_count) == ("2.11.0+cu130", "13.0", True, 1)
    assert (r.capability, r.device_name) == ((9, 0), GPU_NAME)
    assert r.arch_list == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert r.cxx11abi is True
    assert r.git_version == "70d99e998b4955e0049d13a98d77ae1b14db1f45"
    summary = json.loads(read("engine-summary.json"))
    assert summary["torch_probe"]["exit_code"] == 0
    assert summary["torch_report"]["version"] == r.version
    assert summary["reparsed_raw_equals_engine_facts"] is True


def test_status_against_an_h200_expectation(facts, h200):
    assert h200.gpus == GpuExpectation(count=1, compute_capability="9.0", name=GPU_NAME)
    stack = load_stack(REPO / "stack.toml")
    row = compare(h200, stack, facts)
    assert row.reachable and row.problems == []
    cells = row.cells
    assert (cells["gpus"].current, cells["gpus"].expected, cells["gpus"].drift) == ("1x cc 9.0", "1x cc 9.0", False)
    assert cells["torch"].current == "2.11.0"
    assert cells["torch"].drift == (not versions_match("2.11.0", stack.torch.version))
    for name in ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "sgl-kernel"):
        assert (cells[name].current, cells[name].drift) == ("absent", True), name
    assert (cells["sglang"].current, cells["sglang"].drift, cells["sglang"].note) == \
        ("absent", True, "no sglang checkout")
    assert (cells["service"].current, cells["service"].drift) == ("no systemd", True)
    assert row.drift and not row.ok


def test_status_json_printed_by_inv_status(facts, h200):
    printed = json.loads(read("inv-status.json"))
    assert len(printed) == 1
    p = printed[0]
    assert (p["host"], p["reachable"], p["error"], p["problems"], p["drift"], p["ok"]) == \
        ("h200", True, None, [], True, False)
    assert p["cells"]["gpus"] == {"current": "1x cc 9.0", "expected": "1x cc 9.0", "drift": False, "note": ""}
    row = compare(h200, load_stack(REPO / "stack.toml"), facts)
    assert set(row.cells) == set(p["cells"])
    for comp, cell in p["cells"].items():
        assert row.cells[comp].current == cell["current"], comp
        if comp != "torch":  # torch's drift depends on the stack.toml of the day; the rest is absent or exact
            assert row.cells[comp].drift == cell["drift"], comp
    table = read("inv-status.txt")
    assert "1 host(s): 0 on target, drift on h200" in table


def test_a_blackwell_expectation_flags_the_h200(facts, h200):
    blackwell = h200.model_copy(update={"gpus": GpuExpectation(count=8, compute_capability="12.0")})
    row = compare(blackwell, load_stack(REPO / "stack.toml"), facts)
    assert row.cells["gpus"].drift
    assert "host h200 has 1 GPU, inventory expects 8" in row.problems
    assert "host h200 GPU 0 (NVIDIA H200) has compute capability 9.0, expected 12.0" in row.problems
