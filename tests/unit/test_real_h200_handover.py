"""The hand-over's host side as it ran on a real H200 server: pip's reports and the index's access logs."""

from __future__ import annotations

import re
from pathlib import Path

from gpufleet.wheels.wheelset import parse_report

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "real-h200-handover"


def wheel_downloads(log: str) -> list[str]:
    return re.findall(r'"GET /files/(\S+\.whl) HTTP', log)


def test_the_pinned_pip_resolved_from_metadata_alone_where_the_venvs_own_pip_downloaded_every_wheel():
    pinned = (HERE / "access-pinned-pip.log").read_text()
    own = (HERE / "access-venv-pip.log").read_text()
    assert wheel_downloads(pinned) == []
    assert len(re.findall(r"\.whl\.metadata HTTP", pinned)) == 3
    assert sorted(wheel_downloads(own)) == ["flashinfer_cubin-0.6.5-py3-none-any.whl",
                                            "flashinfer_python-0.6.5-py3-none-any.whl",
                                            "nvidia_cudnn_frontend-1.13.0-py3-none-any.whl"]


def test_the_real_report_reads_as_the_files_the_control_node_hands_over():
    refs = parse_report((HERE / "report-pinned-pip.json").read_text())
    assert [(r.name, r.version, r.filename) for r in refs] == [
        ("flashinfer-python", "0.6.5", "flashinfer_python-0.6.5-py3-none-any.whl"),
        ("flashinfer-cubin", "0.6.5", "flashinfer_cubin-0.6.5-py3-none-any.whl"),
        # the index had 1.14.0 too: the lock's constraint held the resolution at 1.13.0
        ("nvidia-cudnn-frontend", "1.13.0", "nvidia_cudnn_frontend-1.13.0-py3-none-any.whl")]
    assert all(r.sha256 and re.fullmatch(r"[0-9a-f]{64}", r.sha256) for r in refs)
    # torch (real, 2.11.0+cu130 with its CUDA cascade) was installed already: nothing of it is in the answer
    cascade = {"torch", "triton", "cuda-toolkit", "cuda-bindings", "nvidia-cublas", "nvidia-cuda-runtime",
               "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-nvshmem-cu13"}
    assert not [r for r in refs if r.name in cascade]
    assert parse_report((HERE / "report-venv-pip.json").read_text()) == refs


def test_the_offline_install_took_only_the_handed_over_files_and_torch_still_saw_the_gpu():
    log = (HERE / "run.log").read_text()
    assert "Looking in links: " in log and "Successfully installed flashinfer-cubin-0.6.5 flashinfer-python-0.6.5 " \
                                           "nvidia-cudnn-frontend-1.13.0" in log
    assert "Requirement already satisfied: torch in /opt/torch/.venv/lib/python3.12/site-packages" in log
    assert "torch still imports from the real venv: /opt/torch/.venv/lib/python3.12/site-packages/torch/__init__.py " \
           "True" in log
