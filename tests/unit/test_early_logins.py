"""Logins begun before the validation (cli/early.py): only from the view the last validated run of the same inventory
bytes and flags remembered, taken only when this run's validated view is that view, never for a jump or sudo host."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gpufleet.cli import early
from gpufleet.config.inventory import load_inventory
from gpufleet.engine import runner

INVENTORY = """\
[settings]
known_hosts = "{dir}/known_hosts"
parallelism = 4

[defaults]
user = "root"
identity_file = "{dir}/key"

[hosts.gpu1]
address = "10.0.0.1"

[hosts.gpu2]
address = "10.0.0.2"
port = 2222

[hosts.gpu3]
address = "10.0.0.3"
become = true
user = "ops"

[hosts.gpu4]
address = "10.0.0.4"
jump = "gpu1"
"""


@pytest.fixture
def started(monkeypatch, tmp_path):
    """Each begun login's hosts and settings, as start() hands them to dial and open_ahead (no socket is opened)."""
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def open_ahead(hosts, inventory, secrets=(), parallelism=None, dialed=None, adopted=False):
        call = SimpleNamespace(hosts=hosts, settings=inventory.settings, adopted=adopted, closed=False)
        calls.append(call)
        return Begun(call)

    monkeypatch.setattr(runner, "open_ahead", open_ahead)
    monkeypatch.setattr("gpufleet.engine.dial.dial", lambda hosts, settings: SimpleNamespace(close=lambda: None))
    return calls


class Begun:
    """What open_ahead gave: closes its call's record."""

    def __init__(self, call):
        self.call = call

    @property
    def closed(self):
        return self.call.closed

    def close(self):
        self.call.closed = True


def write(tmp_path, text=INVENTORY):
    path = tmp_path / "fleet.toml"
    path.write_text(text.format(dir=tmp_path))
    return path


def validated_run(path, flags=None, closed_at_confirm=None):
    """One run as `inv status` makes it: begin, validate, confirm; what confirm gave back. closed_at_confirm: a list
    given the logins' closed state just after confirm (the run's work happens there)."""
    with early.begin("status", inventory=str(path), flags=flags or {}) as logins:
        inv = load_inventory(path)
        taken = logins.confirm(list(inv.hosts.values()), inv.settings)
        if closed_at_confirm is not None and logins.opened is not None:
            closed_at_confirm.append(logins.opened.closed)
        elif closed_at_confirm is not None:
            closed_at_confirm.append(None)
        return taken


def test_the_first_run_logs_in_after_validating_and_the_next_from_what_it_remembered(started, tmp_path):
    path = write(tmp_path)
    assert validated_run(path) is None and started == []  # nothing remembered yet: the regular path logs in
    closed = []
    taken = validated_run(path, closed_at_confirm=closed)
    assert taken is not None and len(started) == 1 and started[0].adopted
    assert closed == [False]  # kept open for the run's work
    begun = started[0]
    # the jump host's target and the sudo host log in after the validation, the regular way
    assert [h.name for h in begun.hosts] == ["gpu1", "gpu2"]
    assert [(h.address, h.port, h.user, h.identity_file) for h in begun.hosts] == [
        ("10.0.0.1", None, "root", str(tmp_path / "key")), ("10.0.0.2", 2222, "root", str(tmp_path / "key"))]
    assert begun.settings.parallelism == 4 and begun.settings.known_hosts == str(tmp_path / "known_hosts")
    assert "known_hosts" in begun.settings.model_fields_set  # HostSession prefers it over ssh_config's


def test_an_edited_inventory_is_never_logged_into_from_an_older_view(started, tmp_path):
    path = write(tmp_path)
    validated_run(path)
    validated_run(path)
    assert len(started) == 1
    # gpu2 leaves the fleet: the next run must not touch it, even though the old view names it
    path.write_text(path.read_text().replace('[hosts.gpu2]\naddress = "10.0.0.2"\nport = 2222\n', ""))
    assert validated_run(path) is None and len(started) == 1
    assert validated_run(path) is not None
    assert [h.name for h in started[-1].hosts] == ["gpu1"]


def test_other_flags_are_remembered_apart(started, tmp_path):
    path = write(tmp_path)
    validated_run(path)
    assert validated_run(path, {"hosts": "gpu2"}) is None and len(started) == 0
    assert validated_run(path) is not None and len(started) == 1


def test_a_validated_view_unlike_the_remembered_one_closes_the_logins(started, tmp_path):
    path = write(tmp_path)
    validated_run(path)
    key = next((tmp_path / "cache" / "logins").iterdir())
    record = json.loads(key.read_text())
    record["hosts"][0]["address"] = "10.9.9.9"  # what an older gpufleet might have read out of the same bytes
    key.write_text(json.dumps(record))
    closed = []
    assert validated_run(path, closed_at_confirm=closed) is None
    assert closed == [None]  # closed by confirm, before the run's own logins
    assert started[0].hosts[0].address == "10.9.9.9" and started[0].closed
    assert json.loads(key.read_text())["hosts"][0]["address"] == "10.0.0.1"  # the validated view, remembered
    assert validated_run(path) is not None


@pytest.mark.parametrize("record", ["not json", json.dumps({"format": 1}), json.dumps([1, 2])])
def test_a_remembered_record_of_another_shape_means_the_regular_login(started, tmp_path, record):
    path = write(tmp_path)
    validated_run(path)
    key = next((tmp_path / "cache" / "logins").iterdir())
    digest = json.loads(key.read_text())["inventory_sha256"]
    try:
        data = json.loads(record)
        if isinstance(data, dict):
            data["inventory_sha256"] = digest
        record = json.dumps(data)
    except ValueError:
        pass
    key.write_text(record)
    assert validated_run(path) is None
    assert validated_run(path) is not None  # remembered anew


def test_an_unreadable_inventory_begins_nothing(started, tmp_path):
    with early.begin("status", inventory=str(tmp_path / "missing.toml"), flags={}) as logins:
        assert logins.opened is None
        assert logins.confirm([], SimpleNamespace(model_dump=lambda mode: {}, model_fields_set=set())) is None
    assert not (tmp_path / "cache" / "logins").exists()


class Session:
    """A stand-in HostSession that records what it adopts."""

    def __init__(self, host):
        self.host, self.conn, self.adopted = host, None, []

    def open(self):
        self.conn = object()
        return self

    def close(self):
        self.conn = None

    def adopt(self, host, settings, secrets):
        self.adopted.append((host, settings, secrets))
        self.host = host

    def __enter__(self):
        return self.open() if self.conn is None else self

    def __exit__(self, *exc):
        self.close()


def test_a_session_opened_from_a_view_takes_the_runs_host_settings_and_secrets(monkeypatch):
    made = []
    monkeypatch.setattr(runner, "session_for", lambda host, inventory, secrets=(), dialed=None:
                        made.append(Session(host)) or made[-1])
    view_host, real_host = SimpleNamespace(name="gpu1"), SimpleNamespace(name="gpu1", venv="/root/venv")
    viewed = SimpleNamespace(settings=SimpleNamespace(parallelism=4))
    real = SimpleNamespace(settings=SimpleNamespace(parallelism=4, validated=True))
    with runner.open_ahead([view_host], viewed, adopted=True) as opened:
        outcomes = runner.for_each_host([real_host], real, lambda s: s.host, secrets=("hf_x",), opened=opened)
    assert len(made) == 1  # the session begun ahead was taken, whatever the run's secrets
    assert made[0].adopted == [(real_host, real.settings, ("hf_x",))]
    assert outcomes[0].value is real_host


def test_a_session_logged_in_from_a_view_refuses_a_sudo_host():
    from gpufleet.engine.ssh import HostSession

    session = HostSession(SimpleNamespace(name="gpu1", become=False), SimpleNamespace())
    with pytest.raises(ValueError, match="gpu1"):
        session.adopt(SimpleNamespace(name="gpu1", become=True, become_user="root"), SimpleNamespace(), ())


def test_no_login_begins_while_new_host_keys_are_accepted(started, tmp_path):
    path = write(tmp_path, INVENTORY.replace("parallelism = 4\n", "parallelism = 4\naccept_new_host_keys = true\n"))
    validated_run(path)
    assert validated_run(path) is None and started == []  # a login would record keys before the run is valid


def test_the_command_line_freezes_the_heap_at_exit_instead_of_collecting_it():
    import subprocess
    import sys

    script = ("import atexit, gc\nimport gpufleet.cli.tasks\nassert gc.get_freeze_count() == 0\n"
              "atexit._run_exitfuncs()\nprint(gc.get_freeze_count() > 0)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_a_run_whose_validation_fails_closes_the_logins_it_began(started, tmp_path):
    from gpufleet.errors import ConfigError

    path = write(tmp_path)
    validated_run(path)
    with pytest.raises(ConfigError):
        with early.begin("status", inventory=str(path), flags={}):
            raise ConfigError(str(tmp_path / "stack.toml"), "a bad stack: no exec may follow")
    assert len(started) == 1 and started[0].closed
