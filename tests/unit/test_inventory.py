"""Unit tests for the inventory loader, its validation messages and host selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import ConfigError
from gpufleet.config.inventory import Host, Inventory, Settings, load_inventory, select_hosts

REPO = Path(__file__).resolve().parents[2]

VALID = """
[settings]
parallelism = 4
connect_timeout = 5
known_hosts = "kh"
accept_new_host_keys = true
command_timeout = 600

[defaults]
user = "root"
gpus = { count = 8, name = "RTX PRO 6000" }

[defaults.stack.server]
port = 31000

[groups]
rack-a = ["gpu1", "gpu2"]
rack-b = []

[hosts.gpu1]
address = "10.0.0.1"

[hosts.gpu2]
address = "gpu2.example.net"
port = 2222
jump = "gpu1"
identity_file = "~/.ssh/id_gpu"

[hosts.gpu3]
address = "10.0.0.3"
jump = "ops@bastion:2200"
groups = ["rack-b"]
gpus = { compute_capability = "9.0" }

[hosts.gpu3.stack.server]
attention_backend = "flashinfer"
"""


def write(tmp_path: Path, text: str, name: str = "inv.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str) -> Inventory:
    return load_inventory(write(tmp_path, text))


def error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return info.value


def host_toml(**fields: str) -> str:
    body = "\n".join(f"{k} = {v}" for k, v in fields.items())
    return f'[hosts.gpu1]\naddress = "10.0.0.1"\n{body}\n'


def assert_names(err: ConfigError, *parts: str) -> None:
    text = str(err)
    for part in parts:
        assert part in text, f"{part!r} not in {text!r}"
    assert "\n" not in text and "pydantic" not in text


# --- valid inventory -------------------------------------------------------------------------------------------

def test_valid_inventory_loads(tmp_path: Path) -> None:
    inv = load(tmp_path, VALID)
    assert list(inv.hosts) == ["gpu1", "gpu2", "gpu3"]
    assert inv.path == tmp_path / "inv.toml"
    assert inv.settings.parallelism == 4 and inv.settings.connect_timeout == 5.0
    assert inv.settings.keepalive == 15.0 and inv.settings.accept_new_host_keys is True
    assert inv.settings.command_timeout == 600
    assert inv.settings.known_hosts == tmp_path.resolve() / "kh"


def test_host_fields_defaults_and_merge(tmp_path: Path) -> None:
    inv = load(tmp_path, VALID)
    gpu1, gpu2, gpu3 = inv.hosts.values()
    assert isinstance(gpu1, Host) and gpu1.name == "gpu1" and gpu1.user == "root" and gpu1.port is None
    assert gpu1.venv == "/root/venv" and gpu1.sglang_checkout == "/root/sglang-main"
    assert gpu1.service == "sglang" and gpu1.model_path == "/models/Qwen3.5-397B-A17B-NVFP4"
    assert gpu1.gpus.count == 8 and gpu1.gpus.compute_capability == "12.0" and gpu1.gpus.name == "RTX PRO 6000"
    assert gpu2.port == 2222 and gpu2.jump == "gpu1"
    assert gpu2.identity_file == Path("~/.ssh/id_gpu").expanduser()
    assert gpu3.gpus.compute_capability == "9.0" and gpu3.gpus.name == "RTX PRO 6000"
    assert gpu3.jump == "ops@bastion:2200"


def test_stack_overrides_merge_defaults_then_host(tmp_path: Path) -> None:
    inv = load(tmp_path, VALID)
    assert inv.hosts["gpu1"].stack_overrides == {"server": {"port": 31000}}
    assert inv.hosts["gpu3"].stack_overrides == {"server": {"port": 31000, "attention_backend": "flashinfer"}}


def test_groups_from_both_sides(tmp_path: Path) -> None:
    inv = load(tmp_path, VALID)
    assert inv.groups == {"rack-a": ["gpu1", "gpu2"], "rack-b": ["gpu3"]}
    assert inv.hosts["gpu1"].groups == ["rack-a"] and inv.hosts["gpu3"].groups == ["rack-b"]


def test_minimal_inventory_defaults(tmp_path: Path) -> None:
    inv = load(tmp_path, host_toml())
    assert inv.settings == Settings()
    assert inv.settings.parallelism == 16 and inv.settings.connect_timeout == 10
    assert inv.settings.known_hosts == Path("~/.ssh/known_hosts").expanduser()
    assert inv.settings.accept_new_host_keys is False and inv.settings.command_timeout is None
    assert inv.settings.ssh_config == Path("~/.ssh/config").expanduser()
    assert inv.groups == {} and inv.hosts["gpu1"].groups == []


def test_relative_identity_file_is_read_from_inventory_dir(tmp_path: Path) -> None:
    inv = load(tmp_path, host_toml(identity_file='"keys/id"'))
    assert inv.hosts["gpu1"].identity_file == tmp_path.resolve() / "keys" / "id"


def test_ipv6_address_and_jump(tmp_path: Path) -> None:
    inv = load(tmp_path, '[hosts.a]\naddress = "fd00::5"\njump = "me@[fd00::1]:22"\n')
    assert inv.hosts["a"].address == "fd00::5"


def test_shipped_example_inventory_loads() -> None:
    inv = load_inventory(REPO / "hosts" / "example.toml")
    assert list(inv.hosts) == ["gpu1", "gpu2", "gpu3"]
    assert len(inv.groups) == 2
    assert any(h.stack_overrides.get("server") for h in inv.hosts.values())
    assert all(h.jump for h in inv.hosts.values())


# --- errors ----------------------------------------------------------------------------------------------------

def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_inventory(tmp_path / "nope.toml")
    assert_names(info.value, "nope.toml", "does not exist")


def test_toml_syntax_error_names_line(tmp_path: Path) -> None:
    err = error(tmp_path, '[hosts.gpu1]\naddress = "a"\nport = \n')
    assert_names(err, "inv.toml", "invalid TOML", "line 3")


def test_duplicate_host_names_file_host_and_line(tmp_path: Path) -> None:
    err = error(tmp_path, '[hosts.gpu1]\naddress = "a"\n\n[hosts.gpu1]\naddress = "b"\n')
    assert_names(err, "inv.toml", "host 'gpu1'", "defined twice", "[hosts.gpu1] at line 4")
    assert err.host == "gpu1"


def test_duplicate_host_subtable_names_host(tmp_path: Path) -> None:
    err = error(tmp_path, '[hosts.gpu1]\naddress = "a"\n[hosts.gpu1.gpus]\ncount = 8\n[hosts.gpu1.gpus]\ncount = 4\n')
    assert_names(err, "inv.toml", "host 'gpu1'", "[hosts.gpu1.gpus] is defined twice", "line 5")


def test_duplicate_key_names_line(tmp_path: Path) -> None:
    err = error(tmp_path, '[hosts.gpu1]\naddress = "a"\naddress = "b"\n')
    assert_names(err, "inv.toml", "line 3")


def test_unknown_top_level_key(tmp_path: Path) -> None:
    err = error(tmp_path, host_toml() + '[setings]\nparallelism = 3\n')
    assert_names(err, "inv.toml", "'setings'", "unknown key", "settings, defaults, groups, hosts")


def test_unknown_settings_key(tmp_path: Path) -> None:
    err = error(tmp_path, "[settings]\nparalelism = 3\n" + host_toml())
    assert_names(err, "inv.toml", "field 'settings.paralelism'", "unknown key", "parallelism", "(got 3)")


def test_unknown_host_key_lists_allowed(tmp_path: Path) -> None:
    err = error(tmp_path, host_toml(adress='"x"'))
    assert_names(err, "inv.toml", "host 'gpu1'", "field 'adress'", "allowed keys", "address", "(got 'x')")
    assert err.host == "gpu1" and err.field == "adress"


def test_unknown_gpus_key(tmp_path: Path) -> None:
    err = error(tmp_path, host_toml(gpus="{ cnt = 8 }"))
    assert_names(err, "host 'gpu1'", "field 'gpus.cnt'", "allowed keys: count, compute_capability, name")


def test_unknown_defaults_key(tmp_path: Path) -> None:
    err = error(tmp_path, '[defaults]\nvenvv = "/x"\n' + host_toml())
    assert_names(err, "inv.toml", "field 'defaults.venvv'", "unknown key", "(got '/x')")


@pytest.mark.parametrize("key, value, field, got", [
    ("port", '"22"', "port", "'22'"),
    ("port", "70000", "port", "70000"),
    ("user", "5", "user", "5"),
    ("groups", '"rack-a"', "groups", "'rack-a'"),
    ("gpus", '{ count = "8" }', "gpus.count", "'8'"),
    ("gpus", "{ compute_capability = 12.0 }", "gpus.compute_capability", "12.0"),
])
def test_wrong_type(tmp_path: Path, key: str, value: str, field: str, got: str) -> None:
    err = error(tmp_path, host_toml(**{key: value}))
    assert_names(err, "inv.toml", "host 'gpu1'", f"field {field!r}", f"(got {got})")
    assert err.field == field


def test_wrong_settings_type(tmp_path: Path) -> None:
    err = error(tmp_path, "[settings]\naccept_new_host_keys = \"yes\"\n" + host_toml())
    assert_names(err, "field 'settings.accept_new_host_keys'", "valid boolean", "(got 'yes')")


def test_settings_must_be_table(tmp_path: Path) -> None:
    err = error(tmp_path, 'settings = 3\n' + host_toml())
    assert_names(err, "inv.toml", "field 'settings'", "must be a table", "(got 3)")


def test_missing_address(tmp_path: Path) -> None:
    err = error(tmp_path, '[hosts.gpu1]\nport = 22\n')
    assert_names(err, "inv.toml", "host 'gpu1'", "field 'address'", "missing")


def test_address_from_defaults_is_allowed(tmp_path: Path) -> None:
    inv = load(tmp_path, '[defaults]\naddress = "nat.example"\n[hosts.a]\nport = 2201\n[hosts.b]\nport = 2202\n')
    assert [h.address for h in inv.hosts.values()] == ["nat.example", "nat.example"]


def test_bad_address(tmp_path: Path) -> None:
    err = error(tmp_path, '[hosts.gpu1]\naddress = "root@10.0.0.1"\n')
    assert_names(err, "host 'gpu1'", "field 'address'", "hostname or IP", "(got 'root@10.0.0.1')")


@pytest.mark.parametrize("field", ["venv", "sglang_checkout", "model_path"])
def test_relative_remote_path(tmp_path: Path, field: str) -> None:
    err = error(tmp_path, host_toml(**{field: '"rel/dir"'}))
    assert_names(err, "inv.toml", "host 'gpu1'", f"field {field!r}", "absolute", "(got 'rel/dir')")


def test_tilde_remote_path_is_relative(tmp_path: Path) -> None:
    err = error(tmp_path, host_toml(venv='"~/venv"'))
    assert_names(err, "field 'venv'", "absolute", "(got '~/venv')")


def test_unknown_group_on_host(tmp_path: Path) -> None:
    err = error(tmp_path, '[groups]\nrack-a = []\n' + host_toml(groups='["rack-z"]'))
    assert_names(err, "inv.toml", "host 'gpu1'", "field 'groups'", "unknown group", "rack-a", "(got 'rack-z')")


def test_group_names_unknown_host(tmp_path: Path) -> None:
    err = error(tmp_path, '[groups]\nrack-a = ["gpu1", "gpu9"]\n' + host_toml())
    assert_names(err, "inv.toml", "field 'groups.rack-a'", "unknown host", "known hosts: gpu1", "(got 'gpu9')")


def test_group_must_list_strings(tmp_path: Path) -> None:
    err = error(tmp_path, '[groups]\nrack-a = "gpu1"\n' + host_toml())
    assert_names(err, "field 'groups.rack-a'", "list of host names", "(got 'gpu1')")


def test_group_and_host_same_name(tmp_path: Path) -> None:
    err = error(tmp_path, '[groups]\ngpu1 = []\n' + host_toml())
    assert_names(err, "field 'groups.gpu1'", "ambiguous", "(got 'gpu1')")


def test_reserved_name_all(tmp_path: Path) -> None:
    err = error(tmp_path, '[hosts.all]\naddress = "a"\n')
    assert_names(err, "inv.toml", "host 'all'", "reserved", "(got 'all')")


@pytest.mark.parametrize("jump", ["bastion", "@bastion", "ops@bas tion", "ops@bastion:99999", "ops@bastion:port",
                                  "ops@-oProxyCommand=x", "-x@bastion"])
def test_bad_jump(tmp_path: Path, jump: str) -> None:
    err = error(tmp_path, host_toml(jump=f'"{jump}"'))
    assert_names(err, "inv.toml", "host 'gpu1'", "field 'jump'", "user@host[:port]", f"(got {jump!r})")


def test_jump_loop(tmp_path: Path) -> None:
    err = error(tmp_path, '[hosts.a]\naddress = "a"\njump = "b"\n[hosts.b]\naddress = "b"\njump = "a"\n')
    assert_names(err, "inv.toml", "host 'a'", "field 'jump'", "loop", "a -> b -> a")


def test_jump_to_self(tmp_path: Path) -> None:
    err = error(tmp_path, host_toml(jump='"gpu1"'))
    assert_names(err, "host 'gpu1'", "field 'jump'", "loop")


def test_stack_must_be_table(tmp_path: Path) -> None:
    err = error(tmp_path, host_toml(stack='"fast"'))
    assert_names(err, "host 'gpu1'", "field 'stack'", "must be a table", "(got 'fast')")


def test_no_hosts(tmp_path: Path) -> None:
    err = error(tmp_path, "[settings]\nparallelism = 2\n")
    assert_names(err, "inv.toml", "no hosts")


def test_settings_value_out_of_range(tmp_path: Path) -> None:
    err = error(tmp_path, "[settings]\nparallelism = 0\n" + host_toml())
    assert_names(err, "field 'settings.parallelism'", "(got 0)")


def test_jump_host_resolves_both_forms(tmp_path: Path) -> None:
    inv = load(tmp_path, VALID)
    assert inv.jump_host("gpu1") is inv.hosts["gpu1"]
    bastion = inv.jump_host("ops@bastion:2200")
    assert (bastion.user, bastion.address, bastion.port, bastion.jump) == ("ops", "bastion", 2200, None)
    assert inv.jump_host("me@[fd00::1]").address == "fd00::1" and inv.jump_host("me@[fd00::1]").port is None
    with pytest.raises(ConfigError, match="user@host"):
        inv.jump_host("nobody")


# --- selection -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, expected", [
    ("gpu1", ["gpu1"]),
    ("gpu3,gpu1", ["gpu1", "gpu3"]),
    ("rack-a", ["gpu1", "gpu2"]),
    ("all", ["gpu1", "gpu2", "gpu3"]),
    ("gpu3,rack-a", ["gpu1", "gpu2", "gpu3"]),
    ("gpu1, gpu1 ,rack-a", ["gpu1", "gpu2"]),
    ("rack-b", ["gpu3"]),
    ("gpu*", ["gpu1", "gpu2", "gpu3"]),
    ("gpu*,!gpu3", ["gpu1", "gpu2"]),
    ("gpu[12]", ["gpu1", "gpu2"]),
    ("!gpu2", ["gpu1", "gpu3"]),
    ("all,!rack-a", ["gpu3"]),
    ("rack-*", ["gpu1", "gpu2", "gpu3"]),
    ("gpu?,!rack-*", []),
])
def test_select_hosts(tmp_path: Path, spec: str, expected: list[str]) -> None:
    inv = load(tmp_path, VALID)
    if not expected:
        with pytest.raises(ConfigError, match="leaves no host"):
            select_hosts(inv, spec)
        return
    assert [h.name for h in select_hosts(inv, spec)] == expected


def test_a_pattern_matching_nothing_is_named(tmp_path: Path) -> None:
    inv = load(tmp_path, VALID)
    with pytest.raises(ConfigError) as info:
        select_hosts(inv, "gpu1,node*")
    assert_names(info.value, "inv.toml", "'node*'", "matches no host", "gpu1, gpu2, gpu3")


def test_select_unknown_names_it_and_lists_known(tmp_path: Path) -> None:
    inv = load(tmp_path, VALID)
    with pytest.raises(ConfigError) as info:
        select_hosts(inv, "gpu1,gpu7")
    assert_names(info.value, "inv.toml", "'gpu7'", "gpu1, gpu2, gpu3", "rack-a, rack-b")


def test_select_empty(tmp_path: Path) -> None:
    inv = load(tmp_path, VALID)
    with pytest.raises(ConfigError, match="empty host selection"):
        select_hosts(inv, " , ")


@pytest.mark.parametrize("line, field", [
    ("connect_timeout = 1e400", "settings.connect_timeout"),  # TOML reads 1e400 as inf
    ("keepalive = inf", "settings.keepalive"),
    ("command_timeout = nan", "settings.command_timeout"),
    ("connect_timeout = 1e300", "settings.connect_timeout"),  # finite, but no socket waits that long
])
def test_numbers_that_are_not_finite_or_absurd_are_named(tmp_path: Path, line: str, field: str) -> None:
    err = error(tmp_path, f"[settings]\n{line}\n" + host_toml())
    assert_names(err, f"field '{field}'")
