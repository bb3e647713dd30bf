"""Become: the inventory's fields, commands wrapped through sudo (rendering, masking, stdin), sudo proved before
anything runs, and keep_owner handing root's new files back to a path's owner (run here with the real sudo)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from gpufleet.config.inventory import Host, load_inventory
from gpufleet.engine.become import Become, BecomeError, prove, wire
from gpufleet.engine.command import MASK, Cmd, Secret, script
from gpufleet.errors import ConfigError
from gpufleet.testing.session import FakeSession

HOSTS = '[hosts.gpu1]\naddress = "10.0.0.1"\nuser = "ubuntu"\n'


def load(tmp_path: Path, text: str):
    path = tmp_path / "inv.toml"
    path.write_text(text)
    return load_inventory(path)


def config_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return str(info.value)


# ---- inventory ------------------------------------------------------------------------------------------------------
def test_become_from_defaults_with_a_password_file(tmp_path):
    (tmp_path / "sudo.pw").write_text("s3cret\n")
    inv = load(tmp_path, '[defaults]\nbecome = true\nbecome_password_file = "sudo.pw"\n' + HOSTS)
    host = inv.hosts["gpu1"]
    assert host.become and host.become_user == "root" and host.become_password == "s3cret"
    assert "s3cret" not in repr(host) and "s3cret" not in str(host.model_dump())
    assert Become.of(host) == Become("root", "s3cret")


def test_become_password_from_the_environment_and_no_become_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEET_SUDO", "from-env")
    inv = load(tmp_path, HOSTS + 'become = true\nbecome_user = "svc"\nbecome_password_env = "FLEET_SUDO"\n'
               '[hosts.gpu2]\naddress = "10.0.0.2"\n')
    assert Become.of(inv.hosts["gpu1"]) == Become("svc", "from-env")
    assert Become.of(inv.hosts["gpu2"]) is None and inv.hosts["gpu2"].become_password is None


@pytest.mark.parametrize("extra, names", [
    ('become = true\nbecome_password_file = "missing.pw"\n', ["become_password_file", "missing.pw", "gpu1"]),
    ('become = true\nbecome_password_env = "GPUFLEET_UNSET_PW"\n', ["become_password_env", "GPUFLEET_UNSET_PW"]),
    ('become = true\nbecome_password_env = "X"\nbecome_password_file = "f"\n', ["not both", "become_password"]),
    ('become_password_env = "X"\n', ["only used with become = true"]),
    ('become = "yes"\n', ["become"]),
    ('become = true\nbecome_user = "a b"\n', ["become_user", "a b"]),
])
def test_bad_become_settings_are_config_errors_naming_field_and_value(tmp_path, monkeypatch, extra, names):
    monkeypatch.delenv("GPUFLEET_UNSET_PW", raising=False)
    monkeypatch.setenv("X", "x")
    text = config_error(tmp_path, HOSTS + extra)
    for name in names:
        assert name in text, text


def test_an_empty_password_file_is_an_error(tmp_path):
    (tmp_path / "empty.pw").write_text("\n")
    assert "empty" in config_error(tmp_path, HOSTS + 'become = true\nbecome_password_file = "empty.pw"\n')


# ---- wrapping -------------------------------------------------------------------------------------------------------
def test_without_become_a_command_is_sent_as_rendered():
    cmd = Cmd.of("systemctl", "restart", "sglang")
    assert wire(cmd, None).text == cmd.render() and wire(cmd, None).stdin == b""


def test_become_wraps_once_in_sudo_and_keeps_secrets_masked_in_what_is_shown():
    cmd = Cmd.of("echo", Secret("hf_token"), env={"A": "1"}, cwd="/srv")
    w = wire(cmd, Become())
    assert w.text.startswith("sudo -n -H -u root -- /bin/bash -c \"$(cat <<'GPUFLEET_")
    # sudo logs its command line: the secret goes on stdin (base64, one line), the text only names it
    assert "hf_token" not in w.text and w.stdin == b"aGZfdG9rZW4=\n"
    assert w.shown == "sudo -n -H -u root -- cd /srv && env A=1 echo " + MASK and "hf_token" not in w.shown
    pw = wire(cmd, Become("svc", "pw!"))
    assert pw.text.startswith("sudo -S -k -p '' -H -u svc -- /bin/bash -c") and pw.stdin == b"pw!\naGZfdG9rZW4=\n"
    assert "pw!" not in pw.text and "pw!" not in pw.shown and "hf_token" not in pw.text
    plain = Cmd.of("echo", "x", cwd="/srv")
    assert plain.render() in wire(plain, Become()).text and wire(plain, Become()).stdin == b""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("sudo"), reason="needs root and sudo")
def test_secrets_on_stdin_reach_the_command_whole_through_real_sudo_and_keep_owner(tmp_path):
    value = "line one 'q' \"d\" $(touch pwned) `x`\nline two\n"
    out = tmp_path / "out"
    cmd = Cmd.of("bash", "-c", 'printf %s "$1" > "$2"; cat', "write", Secret(value), str(out), env={"S": Secret("s2")},
                 keep_owner=(str(tmp_path),))
    w = wire(cmd, Become())
    assert value not in w.text and "s2" not in w.text.replace("GPUFLEET_SECRET_", "")
    proc = subprocess.run(["bash", "-c", w.text], input=w.stdin + b"the command's own stdin\n", capture_output=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == value and proc.stdout == b"the command's own stdin\n"
    assert not (tmp_path / "pwned").exists()


def test_a_login_read_is_never_wrapped():
    cmd = Cmd.of("cat", "/etc/os-release", login=True)
    assert wire(cmd, Become("root", "pw")).text == cmd.render()


needs_sudo = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("sudo"), reason="needs root and sudo")


@needs_sudo
def test_the_wrapped_text_runs_and_the_stream_after_the_password_line_reaches_the_command():
    cmd = script("printf '%s %s\\n' \"$(id -un)\" \"it's\"; head -c 5; echo; wc -c")
    for become in (Become(), None):
        w = wire(cmd, become)
        proc = subprocess.run(["sh", "-c", w.text], input=w.stdin + b"HELLO-and-the-rest", capture_output=True,
                              timeout=30)
        assert proc.returncode == 0 and proc.stdout == b"root it's\nHELLO\n13\n", proc


def test_a_channel_on_a_password_host_sends_the_password_line_before_the_callers_stream():
    host = Host(name="gpu1", address="10.0.0.1", user="ubuntu", become=True)
    host._become_password = "pw"
    session = FakeSession(host=host)
    chan = session.channel(Cmd.of("cat"))
    chan.sendall(b"tar-stream")
    assert bytes(chan.sent) == b"pw\ntar-stream"


def test_sudo_is_proved_in_the_shape_every_command_uses_and_a_refusal_is_one_clear_error():
    session = FakeSession({"become": (1, "sudo: a password is required\n")})
    with pytest.raises(BecomeError) as info:
        prove(session, Become())
    text = str(info.value)
    assert text.startswith("host gpu1: sudo refused `sudo -n -H -u root -- /bin/bash -c true`")
    assert "a password is required" in text and "nothing was changed" in text
    assert session.steps == ["become"] and session.calls[0][1].render() == "true"
    prove(FakeSession(), Become())  # exit 0: proved


# ---- keeping owners -------------------------------------------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_keep_owner_hands_roots_new_files_back_and_keeps_the_exit_code(tmp_path):
    nobody = pwd.getpwnam("nobody")
    owned, rooted = tmp_path / "owned", tmp_path / "rooted"
    owned.mkdir()
    rooted.mkdir()
    os.chown(owned, nobody.pw_uid, nobody.pw_gid)
    for where in (owned, rooted):
        cmd = Cmd.of("bash", "-c", 'mkdir -p "$1/sub" && touch "$1/sub/new" && exit 3', "x", str(where),
                     keep_owner=(str(where),))
        assert subprocess.run(["bash", "-c", cmd.render()]).returncode == 3
    assert (owned / "sub/new").stat().st_uid == nobody.pw_uid and (owned / "sub").stat().st_uid == nobody.pw_uid
    assert (rooted / "sub/new").stat().st_uid == 0
    # a path not there yet takes its parent's owner (a new clone in the login user's home)
    clone = owned / "clone"
    cmd = Cmd.of("mkdir", "-p", f"{clone}/a").owned_by(str(clone))
    assert subprocess.run(["bash", "-c", cmd.render()]).returncode == 0
    assert (clone / "a").stat().st_uid == nobody.pw_uid
    assert "<keep_owner.sh>" in cmd.display() and "keep-owner" in cmd.display()
