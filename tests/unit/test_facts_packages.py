"""Package parsers (pip list JSON, pip freeze) on real and simulated output, and stack_versions."""

from pathlib import Path

import pytest

from gpufleet.errors import FactError
from gpufleet.facts import normalize_name, parse_pip_editables, parse_pip_freeze, parse_pip_list_json
from gpufleet.fleet.status import stack_versions

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL, SIM, BROKEN = FIXTURES / "real-h200", FIXTURES / "sim-blackwell", FIXTURES / "broken"


def test_real_pip_list_json():
    pkgs = parse_pip_list_json((REAL / "pip-list.json").read_text(), "h200")
    assert len(pkgs) == 197
    assert pkgs["torch"] == "2.11.0" and pkgs["triton"] == "3.6.0"
    assert pkgs["jinja2"] == "3.1.6" and "Jinja2" not in pkgs
    assert pkgs["huggingface-hub"] == "1.33.0"


def test_real_freeze_matches_list():
    freeze = parse_pip_freeze((REAL / "pip-freeze.txt").read_text(), "h200")
    listed = parse_pip_list_json((REAL / "pip-list.json").read_text(), "h200")
    assert freeze["torch"] == "2.11.0"
    assert {k: v for k, v in listed.items() if k in freeze} == freeze


def test_real_stack_versions():
    pkgs = parse_pip_list_json((REAL / "pip-list.json").read_text(), "h200")
    assert stack_versions(pkgs) == {"torch": "2.11.0", "flashinfer-python": None, "flashinfer-cubin": None,
                                    "flashinfer-jit-cache": None, "sgl-kernel": None, "sglang": None,
                                    "triton": "3.6.0"}


@pytest.mark.parametrize("name, parser", [("pip-list.json", parse_pip_list_json), ("pip-freeze.txt", parse_pip_freeze)])
def test_blackwell_stack_versions(name, parser):
    versions = stack_versions(parser((SIM / name).read_text(), "bw1"))
    assert versions == {"torch": "2.12.0.dev20260307+cu130", "flashinfer-python": "0.6.5", "flashinfer-cubin": "0.6.5",
                        "flashinfer-jit-cache": "0.6.5+cu130", "sgl-kernel": "0.3.21", "sglang": "0.5.9",
                        "triton": "3.7.0"}


def test_editables():
    assert parse_pip_editables((SIM / "pip-list.json").read_text(), "bw1") == {"sglang": "/root/sglang-main/python"}


def test_sglang_kernel_alias_and_raw_names():
    assert stack_versions({"SGLang_Kernel": "0.4.0"})["sgl-kernel"] == "0.4.0"
    assert stack_versions({"sgl_kernel": "0.3.1", "sglang-kernel": "0.4.0"})["sgl-kernel"] == "0.3.1"


def test_normalize_name():
    assert normalize_name("Flashinfer_Python") == "flashinfer-python"
    assert normalize_name("sgl.kernel") == "sgl-kernel"


def test_json_among_warnings():
    text = "WARNING: something about a cache\n[{\"name\": \"torch\", \"version\": \"2.11.0\"}]\nWARNING: more\n"
    assert parse_pip_list_json(text, "h") == {"torch": "2.11.0"}


def test_freeze_direct_references_are_left_out():
    text = "torch==2.11.0\nfoo @ file:///tmp/foo-1.0-py3-none-any.whl\n-e git+https://x/y.git@abc#egg=bar\n"
    assert parse_pip_freeze(text, "h") == {"torch": "2.11.0"}


@pytest.mark.parametrize("parser, text, detail", [
    (parse_pip_list_json, "gpufleet: venv missing: /opt/venv\n", "could not read packages on host h: venv missing"),
    (parse_pip_list_json, (BROKEN / "pip-list-no-pip.txt").read_text(), "no pip list JSON in output: 'Traceback"),
    (parse_pip_list_json, "", "no pip list JSON"),
    (parse_pip_list_json, "[1, 2]\n", "no pip list JSON"),
    (parse_pip_freeze, "gpufleet: venv missing: /opt/venv\n", "venv missing"),
])
def test_broken(parser, text, detail):
    with pytest.raises(FactError) as err:
        parser(text, "h")
    assert detail in str(err.value)
