"""Stand-in torch.cuda: the simulated GPUs of this host, read from /etc/gpufleet-sim/gpus.json."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

CONFIG_PATH = "/etc/gpufleet-sim/gpus.json"
NO_DRIVER = (
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver "
    "from http://www.nvidia.com/Download/index.aspx"
)
_ARCH_LIST = "@ARCH_LIST@".split(",")


def _config() -> dict | None:
    try:
        with open(os.environ.get("GPUFLEET_SIM_GPUS", CONFIG_PATH)) as handle:
            cfg = json.load(handle)
    except (OSError, ValueError):
        return None
    return None if cfg.get("fail") else cfg


def _visible(total: int) -> list[int]:
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return list(range(total))
    picked = []
    for item in mask.split(","):
        # Like the CUDA runtime, the list stops at the first entry that names no device.
        if not item.strip().isdigit() or int(item) >= total:
            break
        picked.append(int(item))
    return picked


def device_count() -> int:
    cfg = _config()
    return len(_visible(int(cfg.get("count", 0)))) if cfg else 0


def is_available() -> bool:
    return device_count() > 0


def _index(device) -> int:
    if device is None:
        return 0
    if isinstance(device, str):
        return int(device.split(":")[1]) if ":" in device else 0
    return int(getattr(device, "index", device) or 0)


def _device_config(device) -> dict:
    cfg = _config()
    if cfg is None:
        raise RuntimeError(NO_DRIVER)
    if not 0 <= _index(device) < device_count():
        raise RuntimeError("CUDA error: invalid device ordinal")
    return cfg


def get_device_capability(device=None) -> tuple[int, int]:
    major, minor = str(_device_config(device).get("compute_cap", "12.0")).split(".")
    return int(major), int(minor)


def get_device_name(device=None) -> str:
    return _device_config(device).get("name", "NVIDIA RTX PRO 6000 Blackwell Server Edition")


def get_device_properties(device=None) -> SimpleNamespace:
    cfg = _device_config(device)
    major, minor = get_device_capability(device)
    total = int(cfg.get("memory_mib", 97887)) * 1024 * 1024
    return SimpleNamespace(name=get_device_name(device), major=major, minor=minor, total_memory=total,
                           multi_processor_count=188)


def get_arch_list() -> list[str]:
    return list(_ARCH_LIST) if is_available() else []


def current_device() -> int:
    _device_config(0)
    return 0


def set_device(device) -> None:
    _device_config(device)
