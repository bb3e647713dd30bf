"""Where the simulated fleet lives: its name, addresses, ports and the paths every simulated host shares."""

from __future__ import annotations

import os
from pathlib import Path

# One fleet per (prefix, subnet): a second, independent fleet on the same machine sets other values.
PREFIX = os.environ.get("GPUFLEET_SIM_PREFIX", "gfsim")
SUBNET = os.environ.get("GPUFLEET_SIM_SUBNET", "10.213.0")
RUN_DIR = Path(os.environ.get("GPUFLEET_SIM_RUN", f"/run/gpufleet-sim/{PREFIX}"))
HOME_DIR = Path(os.environ.get("GPUFLEET_SIM_HOME", f"/var/lib/gpufleet-sim/{PREFIX}"))
BRIDGE = f"{PREFIX}0"
# The whole prefix: a shortened one made `gfs` and `gfsim` share links, and clearing one fleet cut the other's.
# Linux allows 15 characters: an 8-character prefix, "v-" and "gpu40".
VETH_PREFIX = f"{PREFIX}v-"
CONTROL_ADDR = f"{SUBNET}.1"
INDEX_PORT = 8765
GIT_PORT = 9418
# The stand-in GitHub (FetchContent sources): on loopback only, so the control node can fetch from it and the
# simulated hosts (own network namespaces) cannot, as a real fleet's boxes may not reach github.com.
GITHUB_ADDR = "127.0.0.1"
GITHUB_PORT = 19000 + int(SUBNET.split(".")[1])  # one per fleet: loopback is shared by every fleet on the machine
VENV = "/root/venv"
CHECKOUT = "/root/sglang-main"
MODEL_PATH = "/models/Qwen3.5-397B-A17B-NVFP4"
# Non-root logins on every simulated host (the client key in each one's authorized_keys; root login stays allowed):
# `ops` may sudo anything without a password, `opspw` with its password (SUDO_PASSWORD_FILE), `opsno` may sudo
# only `systemctl status` (a sudoers rule that refuses what gpufleet asks).
SUDO_NOPASSWD_USER = "ops"
SUDO_PASSWORD_USER = "opspw"
SUDO_REFUSED_USER = "opsno"
SIM_USERS = (SUDO_NOPASSWD_USER, SUDO_PASSWORD_USER, SUDO_REFUSED_USER)
SUDO_PASSWORD = "sim-sudo-password"
SUDOERS = (f"{SUDO_NOPASSWD_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"
           f"{SUDO_PASSWORD_USER} ALL=(ALL:ALL) ALL\n"
           # no authentication for opsno: sudo answers "not allowed" at once instead of asking for a password
           f"Defaults:{SUDO_REFUSED_USER} !authenticate\n"
           f"{SUDO_REFUSED_USER} ALL=(root) NOPASSWD: /usr/bin/systemctl status *\n")
