"""Fakes for planners that resolve on the host: pip's dry-run report and gpufleet's resolver wheel."""

from __future__ import annotations

import json

from gpufleet.plan import Upload
from gpufleet.testing.session import FakeSession
from gpufleet.wheels.wheelset import REPORT_MARK

PIP_WHEEL = "/var/cache/gpufleet/tools/pip-26.3-py3-none-any.whl"
RESOLVER = Upload("file:///cache/tools/pip-26.3-py3-none-any.whl", "f" * 64, PIP_WHEEL, "pip", "26.3")


def report(*wheels: tuple[str, str], base: str = "http://10.0.0.1:8765/files", hashed: bool = True) -> str:
    """What the resolve script prints: pip's warnings, the mark, then pip's installation report."""
    items = []
    for i, (name, version) in enumerate(wheels):
        info = {"url": f"{base}/{name.replace('-', '_')}-{version.replace('+', '%2B')}-py3-none-any.whl"}
        if hashed:
            info["archive_info"] = {"hashes": {"sha256": f"{i:064x}"}}
        items.append({"metadata": {"name": name, "version": version}, "download_info": info, "requested": i == 0})
    return "WARNING: something pip says\n" + REPORT_MARK + "\n" + json.dumps({"version": "1", "install": items})


def resolving_probe(answers: dict[str, str], host: str = "gpu1", code: int = 0):
    """A probe answering resolve commands (step names start with '<role>: resolve') by role; records commands."""
    session = FakeSession(name=host, default=(1, ""))
    session.on(lambda step, cmd: ": resolve " in step and step.split(":")[0] in answers,
               lambda step, cmd: (code, answers[step.split(":")[0]]))

    def probe(cmd, step):
        return session.run(cmd, step, check=False)

    probe.asked = session.calls  # (step, cmd) of each
    return probe
