"""Every task and flag is described: `inv --list` lists them, `inv <task> -h` prints help for each."""

import json
import subprocess
import sys

import pytest

from tests.sim.helpers import REPO


def _tasks() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "invoke", "--list", "--list-format=json"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return list(_names(json.loads(out), ""))


def _names(coll: dict, prefix: str):
    for t in coll["tasks"]:
        yield prefix + t["name"]
    for sub in coll["collections"]:
        yield from _names(sub, f"{prefix}{sub['name']}.")


def test_core_tasks_are_listed():
    assert {"facts", "status", "sim.up", "sim.down", "sim.status"} <= set(_tasks())


@pytest.mark.parametrize("name", _tasks())
def test_help_of_each_task_describes_every_flag(name):
    proc = subprocess.run([sys.executable, "-m", "invoke", name, "-h"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "Docstring:" in proc.stdout
    options = proc.stdout.split("Options:", 1)[1] if "Options:" in proc.stdout else ""
    for line in options.splitlines():
        if line.strip().startswith("-"):
            assert len(line.split()) > 1, f"flag without a description in `inv {name} -h`: {line.strip()}"
