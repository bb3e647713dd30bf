"""The wire format split, and parse_facts on whole outputs (healthy, broken, truncated)."""

from pathlib import Path

from gpufleet.facts import parse_facts, parse_sections, script_note
from gpufleet.fleet.status import stack_versions

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_split_with_banner_empty_sections_and_crlf():
    text = ("Last login: somewhere\n@@gpufleet-section a rc=0@@\nline 1\n\nline 3\n"
            "@@gpufleet-section b rc=-1@@\r\n@@gpufleet-section c rc=127@@\nx")
    sections = parse_sections(text)
    assert list(sections) == ["a", "b", "c"]
    assert sections["a"].text == "line 1\n\nline 3\n"
    assert (sections["b"].rc, sections["b"].text) == (-1, "")
    assert (sections["c"].rc, sections["c"].text) == (127, "x\n")


def test_marker_must_be_a_whole_line():
    sections = parse_sections("@@gpufleet-section a rc=0@@\n?? @@gpufleet-section b rc=0@@\n")
    assert list(sections) == ["a"]


def test_no_sections():
    assert parse_sections("") == {} and parse_sections("bash: not found\n") == {}


def test_script_note():
    assert script_note("noise\ngpufleet: venv missing: /v\n") == "venv missing: /v"
    assert script_note("nothing\n") is None


def test_healthy_blackwell_host():
    facts = parse_facts("bw1", (FIXTURES / "sim-blackwell" / "facts.txt").read_text())
    assert facts.problems == []
    assert len(facts.gpus.gpus) == 8 and facts.gpus.cuda_version == "13.0" and facts.gpus.driver_version == "580.95.05"
    assert (facts.cpu_count, facts.python_version, facts.nvcc_version) == (128, "3.12.3", "13.0.88")
    assert facts.os.pretty_name == "Ubuntu 24.04.3 LTS"
    assert [d.mount for d in facts.disks] == ["/root/models", "/"]
    assert stack_versions(facts.packages)["flashinfer-jit-cache"] == "0.6.5+cu130"
    assert facts.checkout.behind == 12 and len(facts.checkout.modified) == 2
    assert facts.unit.enabled == "enabled" and facts.unit.active == "active"
    assert facts.model_dump(mode="json")["gpus"]["gpus"][0]["compute_capability"] == "12.0"


def test_broken_host_never_raises():
    facts = parse_facts("gpu2", (FIXTURES / "broken" / "facts-broken.txt").read_text())
    assert facts.gpus is None and facts.mem_total_bytes is None and facts.packages is None
    assert facts.cpu_count == 128 and facts.os.id == "ubuntu"
    assert facts.checkout.present is False and facts.unit.systemd is False
    assert facts.problems == [
        "could not read GPUs on host gpu2: driver not loaded (nvidia-smi couldn't communicate with the NVIDIA driver)"
        " (exit code 9)",
        "could not read memory on host gpu2: no MemTotal (meminfo) or Mem: row (free -b) in "
        "'grep: /proc/meminfo: No such file or directory' (exit code 2)",
        "could not read disk space on host gpu2: section 'disk' missing from the facts output",
        "could not read nvcc version on host gpu2: nvcc not found (PATH, /usr/local/cuda/bin)",
        "could not read Python version on host gpu2: venv missing: /root/venvs/sglang",
        "could not read packages on host gpu2: venv missing: /root/venvs/sglang",
    ]


def test_truncated_output():
    facts = parse_facts("gpu4", (FIXTURES / "broken" / "facts-truncated.txt").read_text())
    assert len(facts.gpus.gpus) == 2 and facts.gpus.cuda_version == "13.0"
    assert "could not read CPU count on host gpu4: section 'cpu' timed out" in facts.problems
    assert "could not read systemd unit on host gpu4: section 'unit' missing from the facts output" in facts.problems
    assert facts.unit is None and facts.checkout is None


def test_empty_output():
    facts = parse_facts("gpu5", "")
    assert facts.gpus is None and len(facts.problems) == 10  # gpu-header is not read without GPU rows
    assert facts.problems[0] == "could not read GPUs on host gpu5: section 'gpu-query' missing from the facts output"


def test_header_failure_keeps_the_gpus():
    text = (FIXTURES / "sim-blackwell" / "facts.txt").read_text()
    head, _, tail = text.partition("@@gpufleet-section gpu-header rc=0@@\n")
    tail = tail[tail.index("@@gpufleet-section os"):]
    facts = parse_facts("bw1", head + "@@gpufleet-section gpu-header rc=0@@\nweird\n" + tail)
    assert len(facts.gpus.gpus) == 8 and facts.gpus.cuda_version is None
    assert facts.problems == ["could not read driver version on host bw1: no 'Driver Version' in nvidia-smi output: "
                              "'weird'"]


def test_real_h200_facts_script_output():
    facts = parse_facts("h200", (FIXTURES / "real-h200-facts" / "facts.txt").read_text())
    assert facts.problems == []
    [gpu] = facts.gpus.gpus
    assert (gpu.name, gpu.compute_capability, gpu.memory_total_mib) == ("NVIDIA H200", "9.0", 143771)
    assert (facts.gpus.driver_version, facts.gpus.cuda_version) == ("580.159.04", "13.0")
    assert (facts.cpu_count, facts.python_version, facts.nvcc_version) == (16, "3.12.3", "13.0.88")
    assert facts.os.pretty_name == "Ubuntu 24.04.3 LTS" and facts.mem_total_bytes == 135128870912
    assert [(d.path, d.mount) for d in facts.disks] == [("/", "/"), ("/root/models/x", "/")]
    assert stack_versions(facts.packages)["torch"] == "2.11.0" and len(facts.packages) == 197
    assert (facts.checkout.present, facts.checkout.exists) == (False, False)
    assert (facts.unit.systemd, facts.unit.present) == (False, False)
