"""GPU parsers on the real H200 output, the simulated Blackwell output and broken output."""

from pathlib import Path

import pytest

from gpufleet.errors import FactError
from gpufleet.facts import (SUMMARY_QUERY_FIELDS, gpu_facts, parse_gpu_query, parse_query_gpu_csv, parse_smi_header,
                            SmiVersions, parse_smi_list, parse_smi_versions, parse_smi_xml)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL, SIM, BROKEN = FIXTURES / "real-h200", FIXTURES / "sim-blackwell", FIXTURES / "broken"
BLACKWELL = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def read(path: Path) -> str:
    return path.read_text()


def test_real_query_csv_with_header_and_units():
    [gpu] = parse_query_gpu_csv(read(REAL / "query-gpu.csv"), "h200")
    assert gpu.index == 0 and gpu.name == "NVIDIA H200"
    assert gpu.uuid == "GPU-81c13f23-abed-0f9a-d7f7-134cdea8a420"
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.compute_capability == "9.0"
    assert gpu.driver_version == "580.159.04"
    assert gpu.memory_total_mib == 143771


def test_real_summary_nounits_form_needs_its_columns():
    [gpu] = parse_query_gpu_csv(read(REAL / "query-gpu-nounits.csv"), "h200", SUMMARY_QUERY_FIELDS)
    assert (gpu.index, gpu.name, gpu.compute_capability, gpu.driver_version, gpu.memory_total_mib) == (
        0, "NVIDIA H200", "9.0", "580.159.04", 143771)
    assert gpu.uuid is None and gpu.pci_bus_id is None


def test_summary_form_read_with_script_columns_is_an_error():
    with pytest.raises(FactError, match="expected 7 columns, got 6"):
        parse_gpu_query(read(REAL / "query-gpu-nounits.csv"), "h200")


def test_real_header_versions():
    versions = parse_smi_header(read(REAL / "nvidia-smi.txt"), "h200")
    assert (versions.driver_version, versions.cuda_version) == ("580.159.04", "13.0")


def test_real_xml_versions():
    versions = parse_smi_xml(read(REAL / "nvidia-smi-q.xml"), "h200")
    assert (versions.driver_version, versions.cuda_version) == ("580.159.04", "13.0")
    assert parse_smi_versions(read(REAL / "nvidia-smi-q.xml"), "h200") == versions


def test_q_text_form_versions():
    text = ("==============NVSMI LOG==============\n\nTimestamp                : Wed Dec  2 2026\n"
            "Driver Version           : 580.159.04\nCUDA Version             : 13.0\n")
    assert parse_smi_versions(text, "h").cuda_version == "13.0"


def test_cuda_version_not_found_is_none():
    text = "Driver Version                : 580.105.06\nCUDA Version                  : Not Found\n"
    versions = parse_smi_header(text, "h")
    assert versions.driver_version == "580.105.06" and versions.cuda_version is None


def test_real_list():
    [entry] = parse_smi_list(read(REAL / "nvidia-smi-L.txt"), "h200")
    assert (entry.index, entry.name, entry.uuid) == (0, "NVIDIA H200", "GPU-81c13f23-abed-0f9a-d7f7-134cdea8a420")


def test_list_skips_mig_devices():
    text = ("GPU 0: NVIDIA H200 (UUID: GPU-81c13f23-abed-0f9a-d7f7-134cdea8a420)\n"
            "  MIG 1g.18gb     Device  0: (UUID: MIG-1b2c3d4e-0000-1111-2222-333344445555)\n")
    assert len(parse_smi_list(text, "h")) == 1


@pytest.mark.parametrize("name, columns", [
    ("query-gpu.csv", None), ("query-gpu-nounits.csv", SUMMARY_QUERY_FIELDS), ("query-gpu-facts.csv", None)])
def test_blackwell_query_forms(name, columns):
    gpus = parse_query_gpu_csv(read(SIM / name), "bw1", columns)
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {BLACKWELL}
    assert {g.compute_capability for g in gpus} == {"12.0"}
    assert {g.memory_total_mib for g in gpus} == {97887}
    assert {g.driver_version for g in gpus} == {"580.95.05"}


def test_blackwell_script_form_has_uuids_and_buses():
    gpus = parse_gpu_query(read(SIM / "query-gpu-facts.csv"), "bw1")
    assert len({g.uuid for g in gpus}) == 8 and gpus[2].pci_bus_id == "00000000:3A:00.0"


def test_blackwell_versions_and_list():
    for name in ("nvidia-smi.txt", "nvidia-smi-q.xml"):
        versions = parse_smi_versions(read(SIM / name), "bw1")
        assert (versions.driver_version, versions.cuda_version) == ("580.95.05", "13.0")
    listing = parse_smi_list(read(SIM / "nvidia-smi-L.txt"), "bw1")
    assert [e.name for e in listing] == [BLACKWELL] * 8


def test_gpu_facts_combines_rows_and_header():
    gpus = parse_gpu_query(read(SIM / "query-gpu-facts.csv"), "bw1")
    facts = gpu_facts(gpus, parse_smi_header(read(SIM / "nvidia-smi.txt"), "bw1"))
    assert (facts.driver_version, facts.cuda_version, len(facts.gpus)) == ("580.95.05", "13.0", 8)
    assert gpu_facts(gpus, None).cuda_version is None


@pytest.mark.parametrize("name, detail", [
    ("nvidia-smi-no-driver.txt", "driver not loaded"),
    ("nvidia-smi-command-not-found.txt", "nvidia-smi not found"),
    ("nvidia-smi-mismatch.txt", "driver/library version mismatch"),
    ("nvidia-smi-no-devices.txt", "no GPUs found"),
    ("query-gpu-gpu-lost.csv", "Unable to determine the device handle for GPU0000:27:00.0"),
    ("query-gpu-bad-value.csv", "compute capability '[N/A]'"),
])
def test_broken_gpu_output(name, detail):
    with pytest.raises(FactError) as err:
        parse_gpu_query(read(BROKEN / name), "gpu2")
    assert detail in str(err.value)
    assert str(err.value).startswith("could not read GPUs on host gpu2: ")


@pytest.mark.parametrize("parser", [parse_gpu_query, parse_smi_header, parse_smi_xml, parse_smi_list])
def test_empty_output_is_named(parser):
    with pytest.raises(FactError, match="on host gpu3: nvidia-smi printed nothing"):
        parser("", "gpu3")


@pytest.mark.parametrize("parser", [parse_smi_header, parse_smi_list, parse_smi_versions])
def test_no_driver_for_every_form(parser):
    with pytest.raises(FactError, match="driver not loaded"):
        parser(read(BROKEN / "nvidia-smi-no-driver.txt"), "gpu2")


def test_script_note_for_missing_nvidia_smi():
    with pytest.raises(FactError, match="nvidia-smi not found"):
        parse_gpu_query("gpufleet: nvidia-smi not found\n", "gpu2")


def test_header_only_csv_lists_no_gpus():
    with pytest.raises(FactError, match="listed no GPUs"):
        parse_query_gpu_csv("index, name, compute_cap, memory.total [MiB]\n", "gpu2")


def test_header_missing_required_column():
    with pytest.raises(FactError, match="lacks column"):
        parse_query_gpu_csv("index, name\n0, NVIDIA H200\n", "gpu2")


def test_garbage_header_text():
    with pytest.raises(FactError, match="no 'Driver Version'"):
        parse_smi_header("something else entirely\n", "gpu2")
    with pytest.raises(FactError, match="not XML"):
        parse_smi_xml("<nvidia_smi_log><driver_version>", "gpu2")


def test_real_q_text_versions():
    versions = parse_smi_versions(read(FIXTURES / "real-h200-facts" / "nvidia-smi-q.txt"), "h200")
    assert (versions.driver_version, versions.cuda_version) == ("580.159.04", "13.0")


def test_real_h200_smi_version_form():
    """`nvidia-smi --version` (the facts script's gpu-header: 0.01 s against the plain table's 0.10 s on an H200)."""
    text = (FIXTURES / "real-h200-perf" / "nvidia-smi-version.txt").read_text()
    assert parse_smi_header(text, "h200") == SmiVersions(driver_version="580.159.04", cuda_version="13.0")
    assert parse_smi_versions(text, "h200") == SmiVersions(driver_version="580.159.04", cuda_version="13.0")
