"""known_hosts as OpenSSH reads it, on keys, hashed lines and host certificates made by the real ssh-keygen."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest

from gpufleet.engine import openssh
from gpufleet.engine.openssh import HostKeyPolicy, KnownHosts
from gpufleet.errors import HostKeyError

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")


def keygen(path: Path, kind: str = "ed25519") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return path


def pub(path: Path) -> str:
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


def host_key(path: Path) -> paramiko.PKey:
    return paramiko.PKey.from_path(path)


def certify(ca: Path, key: Path, *, principals: str = "gpu1.example", host: bool = True,
            validity: str = "+52w") -> paramiko.PKey:
    args = ["ssh-keygen", "-q", "-s", str(ca), "-I", "gpu1-host", "-n", principals, "-V", validity]
    subprocess.run(args + (["-h"] if host else []) + [f"{key}.pub"], check=True)
    found = paramiko.PKey.from_path(key)
    found.load_certificate(f"{key}-cert.pub")
    return found


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    return {name: keygen(tmp_path / name) for name in ("host", "other", "ca", "rogue_ca")}


def known(tmp_path: Path, text: str) -> KnownHosts:
    path = tmp_path / "known_hosts"
    path.write_text(text)
    return KnownHosts.load([path, tmp_path / "absent"])


def test_a_plain_entry_with_patterns_and_ports(tmp_path, keys):
    kh = known(tmp_path, f"gpu*.example,!gpu9.example {pub(keys['host'])}\n[10.0.0.5]:2222 {pub(keys['host'])}\n")
    key = host_key(keys["host"])
    assert kh.check("gpu1", ["gpu1.example"], key)
    assert not kh.check("gpu9", ["gpu9.example"], key)
    assert kh.check("gpu5", [openssh.host_name("10.0.0.5", 2222)], key)
    assert not kh.check("gpu5", [openssh.host_name("10.0.0.5", 22)], key)


def test_hashed_entries_made_by_ssh_keygen(tmp_path, keys):
    path = tmp_path / "known_hosts"
    path.write_text(f"gpu1.example {pub(keys['host'])}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(path)], check=True, capture_output=True)
    assert path.read_text().startswith("|1|")
    kh = KnownHosts.load([path])
    assert kh.check("gpu1", ["gpu1.example"], host_key(keys["host"]))
    assert not kh.check("gpu2", ["gpu2.example"], host_key(keys["host"]))


def test_a_changed_key_names_the_line(tmp_path, keys):
    kh = known(tmp_path, f"# fleet\ngpu1.example {pub(keys['other'])}\n")
    with pytest.raises(HostKeyError, match=r"CHANGED .*known_hosts:2"):
        kh.check("gpu1", ["gpu1.example"], host_key(keys["host"]))


def test_a_revoked_key_is_refused_even_when_listed(tmp_path, keys):
    kh = known(tmp_path, f"gpu1.example {pub(keys['host'])}\n@revoked * {pub(keys['host'])}\n")
    with pytest.raises(HostKeyError, match=r"REVOKED .*known_hosts:2"):
        kh.check("gpu1", ["gpu1.example"], host_key(keys["host"]))


def test_a_host_certificate_signed_by_a_listed_authority_is_accepted(tmp_path, keys):
    kh = known(tmp_path, f"@cert-authority *.example {pub(keys['ca'])}\n")
    assert kh.authorities(["gpu1.example"]) and not kh.authorities(["gpu1.other"])
    assert kh.check("gpu1", ["gpu1.example"], certify(keys["ca"], keys["host"]))


@pytest.mark.parametrize("why, kwargs, ca, message", [
    ("another CA", {}, "rogue_ca", "not an @cert-authority"),
    ("wrong principal", {"principals": "gpu2.example"}, "ca", "is for gpu2.example"),
    ("a user certificate", {"host": False}, "ca", "not a host certificate"),
    ("expired", {"validity": "20200101:20200102"}, "ca", "expired"),
])
def test_a_bad_host_certificate_is_refused_with_the_reason(tmp_path, keys, why, kwargs, ca, message):
    kh = known(tmp_path, f"@cert-authority *.example {pub(keys['ca'])}\n")
    with pytest.raises(HostKeyError, match=message):
        kh.check("gpu1", ["gpu1.example"], certify(keys[ca], keys["host"], **kwargs))


def test_a_certificate_whose_key_is_revoked_is_refused(tmp_path, keys):
    kh = known(tmp_path, f"@cert-authority *.example {pub(keys['ca'])}\n@revoked * {pub(keys['host'])}\n")
    with pytest.raises(HostKeyError, match="REVOKED"):
        kh.check("gpu1", ["gpu1.example"], certify(keys["ca"], keys["host"]))


def test_unknown_markers_and_broken_lines_are_skipped_as_openssh_does(tmp_path, keys):
    kh = known(tmp_path, f"@future * {pub(keys['host'])}\ngarbage\ngpu1.example ssh-ed25519 notbase64\n")
    assert kh.entries == []


def test_policy_records_under_accept_new_and_refuses_under_yes(tmp_path, keys):
    kh = known(tmp_path, "")
    record = tmp_path / "known_hosts"
    key = host_key(keys["host"])
    with pytest.raises(HostKeyError, match="not in"):
        HostKeyPolicy(kh, ["gpu1.example"], strict="yes", record=record, host="gpu1").missing_host_key(None, "x", key)
    HostKeyPolicy(kh, ["gpu1.example"], strict="accept-new", record=record, host="gpu1").missing_host_key(None, "x", key)
    assert KnownHosts.load([record]).check("gpu1", ["gpu1.example"], key)


def test_ssh_config_include_is_expanded(tmp_path):
    (tmp_path / "a.conf").write_text("Host a\n  Port 2201\n")
    (tmp_path / "b.conf").write_text("Host b\n  Port 2202\n")
    main = tmp_path / "config"
    main.write_text(f"Include {tmp_path}/*.conf\nHost c\n  Port 2203\n")
    config = paramiko.SSHConfig.from_text(openssh.expand_includes(main))
    assert [config.lookup(h)["port"] for h in "abc"] == ["2201", "2202", "2203"]


def test_a_changed_key_shows_both_fingerprints_as_openssh_does(tmp_path, keys):
    """Both keys by their SHA256 fingerprints exactly as `ssh-keygen -l` prints them, and how to drop the old one."""
    kh = known(tmp_path, f"[gpu1.example]:2222 {pub(keys['other'])}\n")
    with pytest.raises(HostKeyError) as caught:
        kh.check("gpu1", ["[gpu1.example]:2222"], host_key(keys["host"]))
    message = str(caught.value)

    def listed(path):
        bits, digest = subprocess.run(["ssh-keygen", "-l", "-f", f"{path}.pub"], capture_output=True, text=True,
                                      check=True).stdout.split()[:2]
        assert digest.startswith("SHA256:") and not digest.endswith("=")
        return digest

    old, new = listed(keys["other"]), listed(keys["host"])
    assert old != new
    assert f"CHANGED from ssh-ed25519 {old} (known for [gpu1.example]:2222 in {tmp_path}/known_hosts:1) to " \
           f"ssh-ed25519 {new}" in message, message
    assert f"ssh-keygen -f {tmp_path}/known_hosts -R '[gpu1.example]:2222'" in message, message


def test_fingerprint_matches_ssh_keygen_for_each_key_type(tmp_path):
    for kind in ("ed25519", "ecdsa", "rsa"):
        path = keygen(tmp_path / f"key_{kind}", kind)
        shown = subprocess.run(["ssh-keygen", "-l", "-f", f"{path}.pub"], capture_output=True, text=True,
                               check=True).stdout.split()
        key = paramiko.PKey.from_path(path)
        assert openssh.fingerprint(key) == f"{key.get_name()} {shown[1]}"
