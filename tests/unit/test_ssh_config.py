"""The engine honours ~/.ssh/config as Fabric does, with the inventory's values winning."""

from gpufleet.config.inventory import GpuExpectation, Host, Settings
from gpufleet.engine.ssh import HostSession


def _session(tmp_path, **host_fields):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host box1\n  HostName 192.0.2.10\n  Port 2200\n  User admin\n")
    settings = Settings(ssh_config=cfg, known_hosts=tmp_path / "known_hosts")
    host = Host(name="gpu1", gpus=GpuExpectation(), **host_fields)
    return HostSession(host, settings)


def test_alias_resolved_from_ssh_config(tmp_path):
    conn = _session(tmp_path, address="box1").connection()
    assert (conn.host, conn.port, conn.user) == ("192.0.2.10", 2200, "admin")


def test_inventory_values_win(tmp_path):
    conn = _session(tmp_path, address="box1", port=22, user="root").connection()
    assert (conn.port, conn.user) == (22, "root")


def test_unknown_host_key_policy_refuses(tmp_path):
    from gpufleet.engine.ssh import _Refuse

    conn = _session(tmp_path, address="box1").connection()
    assert isinstance(conn.client._policy, _Refuse)
