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
    from gpufleet.engine.openssh import HostKeyPolicy

    conn = _session(tmp_path, address="box1").connection()
    assert isinstance(conn.client._policy, HostKeyPolicy) and conn.client._policy.strict == "yes"
    assert conn.client._policy.names == ["[192.0.2.10]:2200"]
    assert len(conn.client.get_host_keys()) == 0  # every key is judged by the policy


def test_include_and_strict_host_key_checking_from_ssh_config(tmp_path):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "fleet.conf").write_text(
        "Host box2\n  HostName 192.0.2.11\n  StrictHostKeyChecking accept-new\n"
        f"  UserKnownHostsFile {tmp_path}/fleet_known\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Include {tmp_path}/conf.d/*.conf\nHost box1\n  HostName 192.0.2.10\n")
    host = Host(name="gpu2", gpus=GpuExpectation(), address="box2")
    conn = HostSession(host, Settings(ssh_config=cfg)).connection()
    policy = conn.client._policy
    assert conn.host == "192.0.2.11" and policy.strict == "accept-new"
    assert policy.record == tmp_path / "fleet_known"


def test_a_proxyjump_from_ssh_config_gets_the_same_policy(tmp_path):
    from gpufleet.engine.openssh import HostKeyPolicy

    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host box1\n  HostName 192.0.2.10\n  ProxyJump ops@bastion.example:2222\n")
    settings = Settings(ssh_config=cfg, known_hosts=tmp_path / "known_hosts")
    conn = HostSession(Host(name="gpu1", gpus=GpuExpectation(), address="box1"), settings).connection()
    gateway = conn.gateway
    assert isinstance(gateway.client._policy, HostKeyPolicy)
    assert gateway.client._policy.names == ["[bastion.example]:2222"] and gateway.client._policy.strict == "yes"
