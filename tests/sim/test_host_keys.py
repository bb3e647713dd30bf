"""End to end: host keys judged as OpenSSH judges them, against the real sshd of a simulated host: a host
certificate signed by an @cert-authority of known_hosts is enough, an @revoked key is refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.sim.helpers import inv_json, write_inventory

pytestmark = pytest.mark.sim
DROP_IN = "etc/ssh/sshd_config.d/gpufleet-test-cert.conf"


def _reload_sshd(fleet) -> None:
    """Reload gpu1's sshd and wait until it answers again: a reload re-executes sshd, and the next test must not
    find port 22 closed for that moment."""
    import time

    fleet.run_on("gpu1", "systemctl reload ssh")
    time.sleep(1.0)  # reload only sends SIGHUP: sshd closes and reopens port 22 some moments later
    deadline = time.monotonic() + 30
    while fleet.run_on("gpu1", "true", check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise AssertionError("gpu1's sshd did not come back within 30 s of a reload")
        time.sleep(0.2)


def _pub(path: Path) -> str:
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


@pytest.fixture
def certified_gpu1(sim_fleet, tmp_path):
    """gpu1's sshd presents its ed25519 key inside a host certificate signed by a CA made here."""
    ca = tmp_path / "fleet_ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ca)], check=True)
    root = sim_fleet.host_root("gpu1")
    host_pub = tmp_path / "ssh_host_ed25519_key.pub"
    host_pub.write_text((root / "etc/ssh/ssh_host_ed25519_key.pub").read_text())
    address = sim_fleet.host("gpu1").address
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-h", "-I", "gpu1", "-n", address, "-V", "+1d",
                    str(host_pub)], check=True)
    (root / "etc/ssh/ssh_host_ed25519_key-cert.pub").write_text((tmp_path / "ssh_host_ed25519_key-cert.pub")
                                                                .read_text())
    drop_in = root / DROP_IN
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    drop_in.write_text("HostCertificate /etc/ssh/ssh_host_ed25519_key-cert.pub\n")
    _reload_sshd(sim_fleet)
    try:
        yield ca, address
    finally:
        drop_in.unlink()
        _reload_sshd(sim_fleet)


def test_a_host_certificate_from_a_listed_authority_is_enough(sim_fleet, tmp_path, certified_gpu1):
    ca, address = certified_gpu1
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority {address.rsplit('.', 1)[0]}.* {_pub(ca)}\n")
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1"], known_hosts=str(known))
    proc, rows = inv_json("status", "--inventory", str(path))
    assert rows[0]["reachable"] is True, rows[0].get("error")
    assert known.read_text().count("\n") == 1  # nothing recorded: the certificate vouched


def test_a_revoked_host_key_is_refused_even_with_a_good_certificate(sim_fleet, tmp_path, certified_gpu1):
    ca, address = certified_gpu1
    host_key = " ".join((sim_fleet.host_root("gpu1") / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority * {_pub(ca)}\n@revoked * {host_key}\n")
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1"], known_hosts=str(known))
    proc, rows = inv_json("status", "--inventory", str(path), "--accept-new-host-keys")
    assert rows[0]["reachable"] is False and "REVOKED" in rows[0]["error"]


def test_the_system_wide_known_hosts_file_counts(sim_fleet, tmp_path):
    """A key listed only in the ssh_config's GlobalKnownHostsFile (OpenSSH's /etc/ssh/ssh_known_hosts) is known."""
    address = sim_fleet.host("gpu1").address
    host_key = " ".join((sim_fleet.host_root("gpu1") / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2])
    system = tmp_path / "ssh_known_hosts"
    system.write_text(f"{address} {host_key}\n")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  GlobalKnownHostsFile {system}\n")
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1"], known_hosts=str(tmp_path / "empty"),
                           extra=f'[settings]\nssh_config = "{config}"\n')
    proc, rows = inv_json("status", "--inventory", str(path))
    assert rows[0]["reachable"] is True, rows[0].get("error")
    assert not (tmp_path / "empty").exists()


def test_a_passphrase_key_in_the_agent_works_beside_an_identity_file(sim_fleet, tmp_path):
    """OpenSSH tries the identity file, then the agent: an encrypted identity file gpufleet cannot open is no reason
    to give up while the agent holds the key."""
    import os
    import signal

    key = tmp_path / "ops_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret-phrase", "-f", str(key)], check=True)
    root = sim_fleet.host_root("gpu1")
    authorized = root / "root/.ssh/authorized_keys"
    before = authorized.read_text()
    agent = subprocess.run(["ssh-agent", "-s", "-a", str(tmp_path / "agent.sock")], capture_output=True, text=True,
                           check=True).stdout
    pid = int(agent.split("SSH_AGENT_PID=")[1].split(";")[0])
    askpass = tmp_path / "askpass"
    askpass.write_text("#!/bin/sh\necho s3cret-phrase\n")
    askpass.chmod(0o700)
    env = {**os.environ, "SSH_AUTH_SOCK": str(tmp_path / "agent.sock"), "SSH_ASKPASS": str(askpass),
           "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"}
    try:
        subprocess.run(["ssh-add", str(key)], env=env, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        authorized.write_text(before + Path(f"{key}.pub").read_text())
        path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1"],
                               extra=f'[defaults]\nidentity_file = "{key}"\n')
        proc, rows = inv_json("status", "--inventory", str(path), env={"SSH_AUTH_SOCK": env["SSH_AUTH_SOCK"]})
        assert rows[0]["reachable"] is True, rows[0].get("error")
    finally:
        authorized.write_text(before)
        os.kill(pid, signal.SIGTERM)


def test_a_user_certificate_from_ssh_config_logs_in(sim_fleet, tmp_path):
    """ssh_config's IdentityFile + CertificateFile: the host trusts a user CA, not the key; gpufleet presents the
    certificate as OpenSSH would."""
    import tomllib

    import tomlkit

    ca = tmp_path / "user_ca"
    key = tmp_path / "cert_key"
    for path in (ca, key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "operator", "-n", "root", "-V", "+1d", f"{key}.pub"],
                   check=True)
    cert = tmp_path / "elsewhere-cert.pub"  # not <key>-cert.pub: found only through CertificateFile
    (tmp_path / "cert_key-cert.pub").rename(cert)
    root = sim_fleet.host_root("gpu1")
    (root / "etc/ssh/gpufleet-test-user-ca.pub").write_text(Path(f"{ca}.pub").read_text())
    drop_in = root / "etc/ssh/sshd_config.d/gpufleet-test-user-ca.conf"
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    drop_in.write_text("TrustedUserCAKeys /etc/ssh/gpufleet-test-user-ca.pub\n")
    _reload_sshd(sim_fleet)
    try:
        config = tmp_path / "ssh_config"
        config.write_text(f"Host {sim_fleet.host('gpu1').address}\n  IdentityFile {key}\n  CertificateFile {cert}\n")
        path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1"],
                               extra=f'[settings]\nssh_config = "{config}"\n')
        data = tomllib.loads(path.read_text())
        del data["defaults"]["identity_file"]  # the key and certificate come from ssh_config alone
        path.write_text(tomlkit.dumps(data))
        proc, rows = inv_json("status", "--inventory", str(path))
        assert rows[0]["reachable"] is True, rows[0].get("error")
    finally:
        drop_in.unlink()
        _reload_sshd(sim_fleet)
