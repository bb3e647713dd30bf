"""gpu_problems: count, compute capability, model, mixed GPUs, unreadable GPUs."""

from pathlib import Path

from gpufleet.facts import Gpu, GpuFacts, HostFacts, gpu_problems, parse_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BLACKWELL = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def host(*specs: tuple[str, str], name: str = "gpu2") -> HostFacts:
    gpus = [Gpu(index=i, name=n, compute_capability=cc, memory_total_mib=97887) for i, (n, cc) in enumerate(specs)]
    return HostFacts(host=name, gpus=GpuFacts(gpus=gpus, driver_version="580.95.05", cuda_version="13.0"))


def test_healthy_blackwell_fixture():
    facts = parse_facts("bw1", (FIXTURES / "sim-blackwell" / "facts.txt").read_text())
    assert gpu_problems(facts, 8, "12.0", BLACKWELL) == []
    assert gpu_problems(facts, 8, "12") == []


def test_fewer_gpus():
    facts = host(*[(BLACKWELL, "12.0")] * 7)
    assert gpu_problems(facts, 8, "12.0") == ["host gpu2 has 7 GPUs, inventory expects 8"]


def test_wrong_capability_names_gpu_and_both_values():
    facts = host(("NVIDIA H200", "9.0"))
    assert gpu_problems(facts, 1, "12.0") == ["host gpu2 GPU 0 (NVIDIA H200) has compute capability 9.0, expected 12.0"]


def test_wrong_model_and_mixed():
    facts = host((BLACKWELL, "12.0"), (BLACKWELL, "12.0"), ("NVIDIA RTX 5090", "12.0"))
    assert gpu_problems(facts, 3, "12.0", BLACKWELL) == [
        f"host gpu2 GPU 2 is NVIDIA RTX 5090, expected {BLACKWELL}",
        f"host gpu2 has mixed GPUs: 2 x {BLACKWELL}, 1 x NVIDIA RTX 5090",
    ]


def test_unreadable_gpus_cite_the_reason():
    facts = parse_facts("gpu2", (FIXTURES / "broken" / "facts-broken.txt").read_text())
    [problem] = gpu_problems(facts, 8, "12.0")
    assert problem.startswith("host gpu2 has no readable GPUs (could not read GPUs on host gpu2: driver not loaded")


def test_no_facts_at_all():
    assert gpu_problems(HostFacts(host="gpu7"), 8, "12.0") == ["host gpu7 has no readable GPUs"]
