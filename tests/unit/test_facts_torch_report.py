"""The torch probe report parser on the real report, and TORCH_REPORT run against stand-in torch modules."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.errors import FactError
from gpufleet.facts import TORCH_REPORT, parse_torch_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

FAKE_TORCH = '''
__version__ = "2.12.0.dev20260307+cu130"
class version:
    cuda = "13.0"
    git_version = "abc"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
    @staticmethod
    def _cuda_getArchFlags():
        return "sm_90 sm_100 sm_120"
class cuda:
    @staticmethod
    def is_available():
        return {avail}
    @staticmethod
    def device_count():
        return {count}
    @staticmethod
    def get_device_capability(i):
        return (12, 0)
    @staticmethod
    def get_device_name(i):
        return "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    @staticmethod
    def get_arch_list():
        return []
'''


def test_real_report():
    report = parse_torch_report((FIXTURES / "real-h200" / "torch.json").read_text(), "h200")
    assert (report.version, report.cuda, report.available, report.device_count) == ("2.11.0+cu130", "13.0", True, 1)
    assert report.capability == (9, 0) and report.device_name == "NVIDIA H200"
    assert "sm_120" in report.arch_list and report.cxx11abi is True


def test_blackwell_report():
    report = parse_torch_report((FIXTURES / "sim-blackwell" / "torch.json").read_text(), "bw1")
    assert report.capability == (12, 0) and report.device_count == 8
    assert report.model_dump(mode="json")["capability"] == [12, 0]


def run_probe(tmp_path: Path, source: str | None) -> str:
    if source is not None:
        (tmp_path / "torch.py").write_text(source)
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
                           + TORCH_REPORT], capture_output=True, text=True)
    return proc.stdout + proc.stderr


def test_probe_with_gpus(tmp_path):
    report = parse_torch_report(run_probe(tmp_path, FAKE_TORCH.format(avail=True, count=8)), "h")
    assert report.capability == (12, 0) and report.device_count == 8 and report.arch_list[-1] == "sm_120"


def test_probe_without_gpu_keeps_arch_list(tmp_path):
    report = parse_torch_report(run_probe(tmp_path, FAKE_TORCH.format(avail=False, count=0)), "h")
    assert (report.available, report.capability, report.device_name) == (False, None, None)
    assert report.arch_list == ["sm_90", "sm_100", "sm_120"]


def test_probe_without_torch(tmp_path):
    with pytest.raises(FactError, match="could not read torch on host h: import torch failed: ModuleNotFoundError"):
        parse_torch_report(run_probe(tmp_path, None), "h")


@pytest.mark.parametrize("text, detail", [
    ("", "no probe JSON"),
    ("Traceback ...\n", "no probe JSON in output: 'Traceback ...'"),
    (json.dumps({"cuda": "13.0"}), "unexpected probe JSON"),
    ((FIXTURES / "broken" / "torch-import-error.json").read_text(), "libcudart.so.13"),
])
def test_broken(text, detail):
    with pytest.raises(FactError) as err:
        parse_torch_report(text, "h")
    assert detail in str(err.value)


def test_warnings_around_the_json():
    text = "UserWarning: blah\n" + (FIXTURES / "real-h200" / "torch.json").read_text() + "more noise\n"
    assert parse_torch_report(text, "h").version == "2.11.0+cu130"


def test_real_probe_output():
    report = parse_torch_report((FIXTURES / "real-h200-facts" / "torch-probe.txt").read_text(), "h200")
    assert (report.version, report.capability, report.cxx11abi) == ("2.11.0+cu130", (9, 0), True)
    assert report.git_version == "70d99e998b4955e0049d13a98d77ae1b14db1f45"
