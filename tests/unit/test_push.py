"""push.py without a host: the remote scripts run by a local bash, their output parsed, commands built, errors named."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpufleet.config.inventory import Host, Settings
from gpufleet.testing.session import FakeSession
from gpufleet.wheels.push import (OPENSSH_MIN_BYTES, PushError, PushItem, check_command, choose_method, openssh_argv,
                           parse_check, parse_receive, receive_command, validate, write_stream)

SHA_A = "a" * 64
SHA_B = "b" * 64


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _item(tmp_path: Path, name: str, data: bytes, remote: str | None = None, sha: str | None = None) -> PushItem:
    local = tmp_path / "local" / name
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(data)
    return PushItem(local, remote or str(tmp_path / "remote" / name), sha or _sha(data))


def _run_local(cmd, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """Run a built command with the local bash, exactly as the host's login shell would get it."""
    return subprocess.run(["bash", "-c", cmd.render()], input=stdin, capture_output=True)


class _BytesSink:
    def __init__(self):
        self.buf = io.BytesIO()

    def write(self, data: bytes) -> None:
        self.buf.write(data)

    def send_file(self, f, size: int) -> None:
        self.buf.write(f.read(size))


def _stream(items) -> bytes:
    sink = _BytesSink()
    write_stream(sink, items, lambda item, size, seconds: None)
    return sink.buf.getvalue()


def test_check_script_reports_present_absent_and_differs(tmp_path):
    good = _item(tmp_path, "good.whl", b"good")
    wrong = _item(tmp_path, "wrong.whl", b"wanted")
    absent = _item(tmp_path, "absent.whl", b"x")
    Path(good.remote).parent.mkdir(parents=True)
    Path(good.remote).write_bytes(b"good")
    Path(wrong.remote).write_bytes(b"something else")
    proc = _run_local(check_command([good, wrong, absent]))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert parse_check("gpu1", [good, wrong, absent], out) == ["present", "differs", "absent"]
    assert f"@@push 1 differs {_sha(b'something else')}" in out


def test_check_output_missing_an_item_is_an_error():
    items = [PushItem(Path("/x"), "/r/a", SHA_A), PushItem(Path("/y"), "/r/b", SHA_B)]
    with pytest.raises(PushError, match="host gpu1: push of /r/b: the remote check gave no answer for item 1"):
        parse_check("gpu1", items, "@@push 0 present\nnoise\n")
    with pytest.raises(PushError, match="item 0"):
        parse_check("gpu1", items, "@@push 0 maybe\n@@push 1 absent\n")


def test_stream_is_a_tar_of_part_files_without_leading_slash(tmp_path):
    item = _item(tmp_path, "t.whl", b"payload" * 100, remote="/opt/wheels/" + "long-name-" * 20 + ".whl")
    with tarfile.open(fileobj=io.BytesIO(_stream([item]))) as tar:
        (member,) = tar.getmembers()
        assert member.name == item.remote.lstrip("/") + ".part"
        assert tar.extractfile(member).read() == b"payload" * 100


def test_receive_installs_good_parts_and_removes_bad_ones(tmp_path):
    good = _item(tmp_path, "good.whl", b"good bytes", remote=str(tmp_path / "new/dir/good.whl"))
    bad = _item(tmp_path, "bad.whl", b"real bytes", sha=SHA_B)
    # Unpacked under root/ instead of /: the script's `-C /` is swapped for the test only, and the remote paths
    # are the ones the stream's members land on there.
    (tmp_path / "root").mkdir()
    Path(f"{tmp_path}/root{bad.remote}").parent.mkdir(parents=True)
    Path(f"{tmp_path}/root{bad.remote}").write_bytes(b"old")
    rooted = [PushItem(i.local, f"{tmp_path}/root{i.remote}", i.sha256) for i in (good, bad)]
    text = receive_command(rooted).render().replace("-C /", f"-C {tmp_path}/root")
    proc = subprocess.run(["bash", "-c", text], input=_stream([good, bad]), capture_output=True)
    out = proc.stdout.decode()
    assert proc.returncode == 1, out + proc.stderr.decode()
    assert Path(rooted[0].remote).read_bytes() == b"good bytes"
    assert Path(rooted[1].remote).read_bytes() == b"old" and not Path(rooted[1].remote + ".part").exists()
    with pytest.raises(PushError) as caught:
        parse_receive("gpu1", rooted, out)
    text = str(caught.value)
    assert text.startswith(f"host gpu1: push of {rooted[1].remote} (from {bad.local}): ")
    assert "wrong sha256 on the host" in text and "left as it was" in text
    assert f"expected sha256 {SHA_B}, got {_sha(b'real bytes')}" in text
    assert caught.value.expected == SHA_B and caught.value.got == _sha(b"real bytes")


def test_receive_cut_stream_leaves_no_final_file(tmp_path):
    item = _item(tmp_path, "big.whl", b"z" * 100_000)
    rooted = [PushItem(item.local, f"{tmp_path}/root{item.remote}", item.sha256)]
    (tmp_path / "root").mkdir()
    text = receive_command(rooted).render().replace("-C /", f"-C {tmp_path}/root")
    proc = subprocess.run(["bash", "-c", text], input=_stream(rooted)[:50_000], capture_output=True)
    assert proc.returncode == 2
    assert not Path(rooted[0].remote).exists() and not Path(rooted[0].remote + ".part").exists()
    with pytest.raises(PushError, match="unpacking the stream failed .tar exit 2.; parts removed, nothing installed"):
        parse_receive("gpu1", rooted, proc.stdout.decode(), proc.stderr.decode())


def test_receive_without_an_answer_says_connection_lost():
    item = PushItem(Path("/c/x.whl"), "/r/x.whl", SHA_A)
    with pytest.raises(PushError, match=r"no answer from the host for item 0 \(connection lost\?\); at most a "
                                        r"\.part file is left, never /r/x\.whl"):
        parse_receive("gpu1", [item], "", "ssh exited 255 (connection failed or dropped): broken pipe")
    parse_receive("gpu1", [item], "@@push 0 ok\n")


@pytest.mark.parametrize("remote, problem", [
    ("relative/x.whl", "absolute and normalised"),
    ("/a/../x.whl", "absolute and normalised"),
    ("/a//x.whl", "absolute and normalised"),
    ("/a/x/", "absolute and normalised"),
])
def test_validate_refuses_unsafe_remote_paths(tmp_path, remote, problem):
    item = _item(tmp_path, "x.whl", b"x", remote=remote)
    with pytest.raises(PushError, match=problem):
        validate("gpu1", [item])


def test_validate_refuses_bad_hash_duplicates_and_missing_local(tmp_path):
    item = _item(tmp_path, "x.whl", b"x", remote="/r/x.whl")
    with pytest.raises(PushError, match="is not 64 lowercase hex digits"):
        validate("gpu1", [PushItem(item.local, item.remote, "ABC")])
    with pytest.raises(PushError, match="the same remote path is pushed twice"):
        validate("gpu1", [item, item])
    with pytest.raises(PushError, match="local file does not exist"):
        validate("gpu1", [PushItem(tmp_path / "nope", "/r/y.whl", SHA_A)])
    validate("gpu1", [item])


def _session(host: Host, settings: Settings, gateway=None):
    return SimpleNamespace(host=host, settings=settings, gateway=gateway, name=host.name)


def test_openssh_argv_keeps_the_inventorys_parameters_and_strict_host_keys(tmp_path):
    settings = Settings(known_hosts=tmp_path / "known_hosts", ssh_config=None, connect_timeout=7, keepalive=15,
                        accept_new_host_keys=True)
    host = Host(name="gpu1", address="10.0.0.5", port=2222, user="ops", identity_file=tmp_path / "id_ed25519")
    argv = openssh_argv(_session(host, settings), "true")
    text = " ".join(argv)
    assert argv[0] == "ssh" and argv[-2:] == ["10.0.0.5", "true"]
    assert "-o StrictHostKeyChecking=yes" in text and "accept-new" not in text and "=no" not in text.replace(
        "UpdateHostKeys=no", "")
    assert f"-o UserKnownHostsFile={tmp_path}/known_hosts" in text
    assert "-o GlobalKnownHostsFile=/dev/null" in text and "-o BatchMode=yes" in text
    assert "-F /dev/null" in text and "-o ConnectTimeout=7" in text and "-o ServerAliveInterval=15" in text
    assert f"-i {tmp_path}/id_ed25519 -o IdentitiesOnly=yes" in text
    assert "-p 2222" in text and "-l ops" in text and "ProxyCommand" not in text


def test_openssh_argv_jump_host_gets_its_own_options_and_escaped_tokens(tmp_path):
    settings = Settings(known_hosts=tmp_path / "k%h", ssh_config=None)
    jump = Host(name="bastion", address="192.0.2.1", user="j", identity_file=tmp_path / "jump_key")
    host = Host(name="gpu1", address="10.0.0.5", user="root", jump="bastion")
    argv = openssh_argv(_session(host, settings, gateway=_session(jump, settings)))
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert proxy.endswith(" -W %h:%p")
    assert f"-i {tmp_path}/jump_key -o IdentitiesOnly=yes" in proxy and " -l j 192.0.2.1 -W" in proxy
    # A literal % in a path is %% for the target's ssh, and %%%% inside the jump's command line (expanded twice).
    assert f"UserKnownHostsFile={tmp_path}/k%%h" in argv
    assert f"UserKnownHostsFile={tmp_path}/k%%%%h" in proxy
    assert "-o StrictHostKeyChecking=yes" in proxy


def test_large_pushes_go_over_openssh_small_ones_over_the_open_transport():
    assert choose_method(OPENSSH_MIN_BYTES, "/usr/bin/ssh") == "openssh"
    assert choose_method(OPENSSH_MIN_BYTES - 1, "/usr/bin/ssh") == "paramiko"
    assert choose_method(10 * OPENSSH_MIN_BYTES, None) == "paramiko"  # no ssh binary: the fallback


def test_states_the_caller_already_read_spare_the_second_check(tmp_path, mocker):
    from gpufleet.wheels import push

    items = [_item(tmp_path, "a.whl", b"a"), _item(tmp_path, "b.whl", b"b")]
    session = FakeSession()
    send = mocker.patch.object(push, "_send_paramiko", return_value=("", ""))
    mocker.patch.object(push, "parse_receive")
    report = push.push_files(session, items, states=["absent", "differs"], method="paramiko")
    assert session.calls == []  # no remote check
    assert send.call_args.args[1] == items and report.method == "paramiko"
    with pytest.raises(ValueError, match="1 states for 2 files"):
        push.push_files(session, items, states=["absent"])


def test_the_paramiko_path_streams_into_an_exec_channel_of_the_session(tmp_path):
    from gpufleet.wheels import push

    items = [_item(tmp_path, "a.whl", b"a" * 5000), _item(tmp_path, "b.whl", b"b")]
    session = FakeSession({"channel": (0, "@@push 0 ok\n@@push 1 ok\n")})
    sent = []
    out, err = push._send_paramiko(session, items, lambda item, size, seconds: sent.append((item, size)))
    assert session.calls == [("channel", receive_command(items))]
    assert sent == [(items[0], 5000), (items[1], 1)] and out == "@@push 0 ok\n@@push 1 ok\n" and err == ""
    [chan] = session.channels
    assert chan.write_shut and chan.closed
    done = _run_local(receive_command(items), bytes(chan.sent))  # what went into the channel unpacks on a host
    parse_receive("gpu1", items, done.stdout.decode(), done.stderr.decode())
    assert Path(items[0].remote).read_bytes() == b"a" * 5000 and Path(items[1].remote).read_bytes() == b"b"
