"""End to end: push_files onto a simulated host over real sshd: skip, replace, verify, refuse, survive a cut."""

from __future__ import annotations

import hashlib
import os

import pytest

from gpufleet.wheels import push
from gpufleet.config.inventory import load_inventory
from gpufleet.wheels.push import PushError, PushItem, push_files
from gpufleet.engine.runner import session_for

pytestmark = pytest.mark.sim

HOST = "gpu3"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def session(sim_fleet):
    inv = load_inventory(sim_fleet.inventory_path)
    with session_for(inv.hosts[HOST], inv) as s:
        yield s


@pytest.fixture
def remote_dir(sim_fleet, request):
    path = f"/root/push-test/{request.node.name.replace('[', '-').rstrip(']')}"
    sim_fleet.run_on(HOST, f"rm -rf {path}")
    yield path
    sim_fleet.run_on(HOST, f"rm -rf {path}")


def _files(tmp_path, remote_dir, sizes: dict[str, int]) -> list[PushItem]:
    items = []
    for name, size in sizes.items():
        data = os.urandom(size)
        local = tmp_path / name
        local.write_bytes(data)
        items.append(PushItem(local, f"{remote_dir}/{name}", _sha(data)))
    return items


def _remote_listing(fleet, remote_dir) -> dict[str, str]:
    out = fleet.run_on(HOST, f"cd {remote_dir} 2>/dev/null && find . -type f -exec sha256sum {{}} + || true").stdout
    return {line.split()[1][2:]: line.split()[0] for line in out.splitlines()}


@pytest.mark.parametrize("method", ["openssh", "paramiko"])
def test_push_then_second_push_sends_nothing(sim_fleet, session, remote_dir, tmp_path, method):
    items = _files(tmp_path, remote_dir, {"torch.whl": 3_000_000, "nvidia_cublas.whl": 700_000, "empty.whl": 0})
    items.append(PushItem(items[0].local, f"{remote_dir}/deep/new/dir/torch.whl", items[0].sha256))
    said: list[str] = []
    report = push_files(session, items, say=said.append, method=method)
    assert [f.state for f in report.files] == ["pushed"] * 4 and report.method == method
    assert report.bytes_sent == 2 * 3_000_000 + 700_000
    assert _remote_listing(sim_fleet, remote_dir) == {i.remote[len(remote_dir) + 1:]: i.sha256 for i in items}
    assert any(line.startswith("torch.whl: 3.0 MB sent in ") and line.endswith("MB/s)") for line in said), said

    said.clear()
    again = push_files(session, items, say=said.append, method=method)
    assert [f.state for f in again.files] == ["already there"] * 4 and again.bytes_sent == 0
    assert said == [f"{os.path.basename(i.remote)}: already there" for i in items]


def test_file_corrupted_on_the_host_is_replaced(sim_fleet, session, remote_dir, tmp_path):
    items = _files(tmp_path, remote_dir, {"a.whl": 200_000, "b.whl": 100_000})
    push_files(session, items)
    sim_fleet.run_on(HOST, f"echo corrupted > {items[1].remote}")
    said: list[str] = []
    report = push_files(session, items, say=said.append)
    assert [(f.item.remote, f.state) for f in report.files] == [(items[0].remote, "already there"),
                                                                (items[1].remote, "pushed")]
    assert "b.whl: on the host with another sha256, replacing it" in said
    assert _remote_listing(sim_fleet, remote_dir) == {"a.whl": items[0].sha256, "b.whl": items[1].sha256}


@pytest.mark.parametrize("method", ["openssh", "paramiko"])
def test_wrong_expected_sha256_raises_and_leaves_nothing(sim_fleet, session, remote_dir, tmp_path, method):
    (item,) = _files(tmp_path, remote_dir, {"cubin.whl": 500_000})
    wrong = PushItem(item.local, item.remote, "0" * 64)
    with pytest.raises(PushError) as caught:
        push_files(session, [wrong], method=method)
    text = str(caught.value)
    assert text.startswith(f"host {HOST}: push of {item.remote} (from {item.local}): the transferred file has the "
                           f"wrong sha256 on the host"), text
    assert f"expected sha256 {'0' * 64}, got {item.sha256}" in text
    assert _remote_listing(sim_fleet, remote_dir) == {}


def test_connection_dropped_midway_leaves_no_final_file(sim_fleet, session, remote_dir, tmp_path, monkeypatch):
    items = _files(tmp_path, remote_dir, {"first.whl": 1_000_000, "second.whl": 20_000_000})
    send_file = push._ChannelSink.send_file

    def cut_in_second_file(sink, f, size):
        if f.name.endswith("second.whl"):
            send_file(sink, _Head(f, size // 2), size // 2)
            session.conn.transport.close()  # the link goes away with half of the second file sent
        send_file(sink, f, size)

    monkeypatch.setattr(push._ChannelSink, "send_file", cut_in_second_file)
    with pytest.raises(PushError, match=f"host {HOST}: push of {items[0].remote} .*no answer from the host"):
        push_files(session, items, method="paramiko")
    monkeypatch.undo()
    # The stream never ended: nothing was verified, so nothing is installed, and the parts are gone.
    assert _remote_listing(sim_fleet, remote_dir) == {}
    session.reconnect()
    report = push_files(session, items)
    assert [f.state for f in report.files] == ["pushed", "pushed"]
    assert _remote_listing(sim_fleet, remote_dir) == {"first.whl": items[0].sha256, "second.whl": items[1].sha256}


class _Head:
    """The first n bytes of an open file, as a file."""

    def __init__(self, f, n: int):
        self.f, self.left, self.name = f, n, f.name

    def read(self, size: int) -> bytes:
        data = self.f.read(min(size, self.left))
        self.left -= len(data)
        return data
