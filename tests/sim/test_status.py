"""End to end: `inv facts` and `inv status` over real SSH against the simulated Blackwell fleet."""

from __future__ import annotations

import json

import pytest

from tests.sim.helpers import inv, inv_json, write_inventory

pytestmark = pytest.mark.sim


def test_status_shows_drift_from_old_stack_on_three_hosts(sim_fleet):
    proc, rows = inv_json("status", "--inventory", str(sim_fleet.inventory_path))
    assert proc.returncode == 1, proc.stderr
    assert [r["host"] for r in rows] == ["gpu1", "gpu2", "gpu3"]
    for row in rows:
        assert row["reachable"] and row["drift"]
        cells = row["cells"]
        assert cells["gpus"] == {"current": "8x cc 12.0", "expected": "8x cc 12.0", "drift": False, "note": ""}
        assert cells["torch"]["current"] == "2.9.1+cu130"
        assert cells["torch"]["expected"] == "2.12.0.dev20260307+cu130"
        assert cells["torch"]["drift"]
        for name in ("flashinfer-python", "flashinfer-cubin"):
            assert (cells[name]["current"], cells[name]["expected"], cells[name]["drift"]) == ("0.6.4", "0.6.5", True)
        assert cells["flashinfer-jit-cache"]["current"] == "0.6.4+cu130"
        assert cells["sgl-kernel"]["current"] == "0.3.16"
        assert cells["sglang"]["current"].startswith("main@")
        assert "2 local edit(s)" in cells["sglang"]["note"]
        assert cells["service"]["current"] == "absent"


def test_status_table_for_people(sim_fleet):
    proc = inv("status", "--inventory", str(sim_fleet.inventory_path), "--hosts", "gpu1")
    assert proc.returncode == 1
    assert "gpu1" in proc.stdout and "2.9.1+cu130" in proc.stdout and "2.12.0.dev20260307+cu130" in proc.stdout
    assert "drift on gpu1" in proc.stdout


def test_facts_of_one_host(sim_fleet):
    proc, facts = inv_json("facts", "--host", "gpu2", "--inventory", str(sim_fleet.inventory_path))
    assert proc.returncode == 0, proc.stderr
    assert facts["host"] == "gpu2"
    gpus = facts["gpus"]["gpus"]
    assert len(gpus) == 8
    assert {g["compute_capability"] for g in gpus} == {"12.0"}
    assert gpus[0]["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert facts["gpus"]["driver_version"].startswith("580.")
    assert facts["gpus"]["cuda_version"] == "13.0"
    assert facts["packages"]["torch"] == "2.9.1+cu130"
    assert facts["checkout"]["branch"] == "main"
    assert len(facts["checkout"]["modified"]) == 2
    assert facts["unit"]["systemd"] is True and facts["unit"]["present"] is False
    assert facts["cpu_count"] >= 1 and facts["mem_total_bytes"] > 0
    assert facts["problems"] == []


def test_the_drivers_cuda_version_is_remembered_until_the_driver_changes(sim_fleet):
    """The host keeps nvidia-smi --version's answer under /proc/driver/nvidia/version (the stand-in driver's file);
    another driver loaded is asked afresh, and a CUDA version kept by hand is used while the driver is the same."""
    def cuda(host: str) -> str:
        proc, facts = inv_json("facts", "--host", host, "--inventory", str(sim_fleet.inventory_path))
        assert proc.returncode == 0, proc.stderr
        return facts["gpus"]["cuda_version"]

    memo = sim_fleet.host_root("gpu2") / "root/.cache/gpufleet/driver-cuda"
    assert cuda("gpu2") == "13.0"
    assert "CUDA Version        : 13.0" in memo.read_text()
    memo.write_text(memo.read_text().replace("CUDA Version        : 13.0", "CUDA Version        : 13.7"))
    assert cuda("gpu2") == "13.7"  # the remembered answer, not a second nvidia-smi
    sim_fleet.set_gpus("gpu2", driver="590.44.01", cuda="13.1")
    try:
        assert cuda("gpu2") == "13.1"
    finally:
        sim_fleet.set_gpus("gpu2", driver="580.95.05", cuda="13.0")
    assert cuda("gpu2") == "13.0"


def test_unreachable_host_does_not_stop_the_others(sim_fleet, tmp_path):
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1", "gpu3"], connect_timeout=2)
    sim_fleet.set_link("gpu3", up=False)
    try:
        proc, rows = inv_json("status", "--inventory", str(path))
    finally:
        sim_fleet.set_link("gpu3", up=True)
    assert proc.returncode == 1
    by_host = {r["host"]: r for r in rows}
    assert by_host["gpu1"]["reachable"] is True
    assert by_host["gpu3"]["reachable"] is False
    assert sim_fleet.host("gpu3").address in by_host["gpu3"]["error"]


def test_refused_port_is_unreachable(sim_fleet, tmp_path):
    extra = f'[hosts.closed]\naddress = "{sim_fleet.host("gpu1").address}"\nport = 2222\n'
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1"], extra=extra, connect_timeout=2)
    proc, rows = inv_json("status", "--inventory", str(path))
    by_host = {r["host"]: r for r in rows}
    assert by_host["gpu1"]["reachable"] and not by_host["closed"]["reachable"]
    assert "cannot connect" in by_host["closed"]["error"]


def test_unknown_host_key_is_refused_then_accept_new_records_it(sim_fleet, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1"], known_hosts=str(known))
    proc, rows = inv_json("status", "--inventory", str(path))
    assert rows[0]["reachable"] is False
    assert "not in" in rows[0]["error"] and "refusing" in rows[0]["error"]
    assert known.read_text() == ""

    proc, rows = inv_json("status", "--inventory", str(path), "--accept-new-host-keys")
    assert rows[0]["reachable"] is True
    recorded = known.read_text().split()
    real = (sim_fleet.host_root("gpu1") / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    assert recorded[1:3] == real[0:2]


def test_changed_host_key_is_refused_even_with_accept_new(sim_fleet, tmp_path):
    other = (sim_fleet.host_root("gpu2") / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"{sim_fleet.host('gpu1').address} {other[0]} {other[1]}\n")
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1"], known_hosts=str(known))
    proc, rows = inv_json("status", "--inventory", str(path), "--accept-new-host-keys")
    assert rows[0]["reachable"] is False
    assert "CHANGED" in rows[0]["error"]


def test_host_with_seven_gpus_is_flagged(sim_fleet):
    sim_fleet.set_gpus("gpu3", count=7)
    try:
        proc, rows = inv_json("status", "--inventory", str(sim_fleet.inventory_path), "--host", "gpu3")
    finally:
        sim_fleet.set_gpus("gpu3", count=8)
    row = rows[0]
    assert row["cells"]["gpus"]["current"] == "7x cc 12.0"
    assert row["cells"]["gpus"]["drift"] is True
    assert any("7" in p and "8" in p for p in row["problems"]), row["problems"]


def test_driver_failure_is_reported_not_crashed(sim_fleet):
    sim_fleet.set_gpus("gpu3", fail="driver")
    try:
        proc, rows = inv_json("status", "--inventory", str(sim_fleet.inventory_path), "--host", "gpu3")
    finally:
        sim_fleet.set_gpus("gpu3", fail=None)
    row = rows[0]
    assert row["reachable"] and row["cells"]["gpus"]["drift"]
    assert any("gpu3" in p for p in row["problems"]), row["problems"]


def test_inventory_error_names_file_host_field_and_value(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[hosts.gpu1]\naddress = "10.0.0.1"\nvenv = "relative/venv"\n')
    proc = inv("status", "--inventory", str(bad))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    msg = proc.stderr
    assert str(bad) in msg and "gpu1" in msg and "venv" in msg and "relative/venv" in msg


def test_unknown_host_selection_is_a_clear_error(sim_fleet):
    proc = inv("status", "--inventory", str(sim_fleet.inventory_path), "--host", "gpu9")
    assert proc.returncode == 2
    assert "gpu9" in proc.stderr and "Traceback" not in proc.stderr


def test_host_behind_a_jump_host(sim_fleet, tmp_path):
    extra = '[hosts.gpu2]\naddress = "%s"\njump = "gpu1"\n' % sim_fleet.host("gpu2").address
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1"], extra=extra)
    proc, facts = inv_json("facts", "--host", "gpu2", "--inventory", str(path))
    assert proc.returncode == 0, proc.stderr
    assert facts["host"] == "gpu2" and len(facts["gpus"]["gpus"]) == 8
    # The jump really carried the connection: gpu2's sshd saw it come from gpu1's address.
    log = sim_fleet.run_on("gpu2", "journalctl -u ssh --no-pager -o cat | grep Accepted").stdout
    assert f"from {sim_fleet.host('gpu1').address} " in log, log


def test_one_connection_per_host_for_a_run(sim_fleet, tmp_path):
    from gpufleet.engine.command import Cmd
    from gpufleet.config.inventory import load_inventory
    from gpufleet.engine.runner import session_for

    inv_ = load_inventory(sim_fleet.inventory_path)
    session = session_for(inv_.hosts["gpu1"], inv_)
    with session:
        transport = session.conn.transport
        for i in range(3):
            session.run(Cmd.of("true"), step=f"probe {i}")
        assert session.conn.transport is transport and transport.is_active()
    assert [r.step for r in session.results] == ["probe 0", "probe 1", "probe 2"]


def test_the_connection_opened_before_paramiko_is_the_one_it_logs_in_on(sim_fleet):
    """`inv status` opens the TCP connections while paramiko is imported (engine/dial.py); paramiko must log in on
    exactly those sockets, not dial again."""
    from gpufleet.config.inventory import load_inventory
    from gpufleet.engine.command import Cmd
    from gpufleet.engine.dial import dial
    from gpufleet.engine.runner import for_each_host

    inv_ = load_inventory(sim_fleet.inventory_path)
    hosts = [inv_.hosts["gpu1"], inv_.hosts["gpu2"]]
    with dial(hosts, inv_.settings) as dialed:
        assert sorted(dialed._early) == ["gpu1", "gpu2"]
        for early in dialed._early.values():
            early.done.wait()
        dialled = {name: early.sock.getsockname() for name, early in dialed._early.items()}

        def work(session):
            return session.conn.transport.sock.getsockname(), session.run(Cmd.of("true"), step="probe").ok

        outcomes = for_each_host(hosts, inv_, work, dialed=dialed)
    assert [o.value for o in outcomes] == [(dialled["gpu1"], True), (dialled["gpu2"], True)], outcomes


def accepted_logins(fleet, name: str) -> int:
    """Logins sshd has accepted on a host so far, this count's own included."""
    out = fleet.run_on(name, "journalctl -b -o cat _COMM=sshd _COMM=sshd-session | grep -c '^Accepted publickey' "
                             "|| true").stdout
    return int(out.strip() or 0)


def test_status_logs_in_from_the_last_validated_view_and_never_to_a_host_left_out_since(sim_fleet, tmp_path):
    """cli/early.py: a second `inv status` over the same inventory bytes logs in while it validates, with the same
    answers; after an edit that leaves gpu2 out, nothing logs in to gpu2 (its old view is not used)."""
    cache = {"GPUFLEET_CACHE_DIR": str(tmp_path / "cache")}
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1", "gpu2"])
    first, rows = inv_json("status", "--inventory", str(path), env=cache)
    memo = list((tmp_path / "cache" / "logins").iterdir())
    assert len(memo) == 1 and [h["name"] for h in json.loads(memo[0].read_text())["hosts"]] == ["gpu1", "gpu2"]
    before = accepted_logins(sim_fleet, "gpu2")
    second, again = inv_json("status", "--inventory", str(path), env=cache)
    assert (first.returncode, second.returncode) == (1, 1), second.stderr
    def seen(r):
        return r["host"], r["reachable"], r["cells"]["torch"], r["cells"]["sglang"], r["cells"]["service"]

    assert [seen(r) for r in again] == [seen(r) for r in rows] and all(r["reachable"] for r in again)
    assert accepted_logins(sim_fleet, "gpu2") == before + 2  # the second status's, and this count's
    write_inventory(sim_fleet, path, ["gpu1"])  # gpu2 leaves the fleet
    before = accepted_logins(sim_fleet, "gpu2")
    third, rows = inv_json("status", "--inventory", str(path), env=cache)
    assert [r["host"] for r in rows] == ["gpu1"] and third.returncode == 1, third.stderr
    assert accepted_logins(sim_fleet, "gpu2") == before + 1  # this count's alone
