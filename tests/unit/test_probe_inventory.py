"""--apply's inventory write: only the host's server keys change; comments, order and other hosts stay."""

from __future__ import annotations

import pytest
import tomllib

from gpufleet.errors import ConfigError
from gpufleet.probe.inventory_write import set_host_server_keys, write_host_server_keys

INVENTORY = """# the fleet (keep me)
[settings]
connect_timeout = 10   # seconds

[defaults.stack.server]
health_timeout = 60

[hosts.gpu1]
address = "10.0.0.1"  # canary

[hosts.gpu2]
address = "10.0.0.2"

[hosts.gpu2.stack.server]
attention_backend = "triton"   # chosen by hand in 2026
mem_fraction_static = 0.8
"""


def test_new_tables_are_added_under_the_host_and_everything_else_stays():
    out = set_host_server_keys(INVENTORY, "gpu1", {"fp4_gemm_backend": "flashinfer_cutlass",
                                                   "speculative.algorithm": "none"})
    data = tomllib.loads(out)
    assert data["hosts"]["gpu1"]["stack"]["server"] == {"fp4_gemm_backend": "flashinfer_cutlass",
                                                        "speculative": {"algorithm": "none"}}
    assert data["hosts"]["gpu2"] == tomllib.loads(INVENTORY)["hosts"]["gpu2"]
    assert set(INVENTORY.splitlines()) <= set(out.splitlines())
    # the new tables sit with gpu1, before gpu2's entry
    assert out.index("[hosts.gpu1.stack.server]") < out.index("[hosts.gpu2]")
    assert "\n\n[hosts.gpu2]" in out


def test_existing_keys_are_replaced_in_place_with_their_comments():
    out = set_host_server_keys(INVENTORY, "gpu2", {"attention_backend": "flashinfer"})
    assert 'attention_backend = "flashinfer"   # chosen by hand in 2026' in out
    assert out.replace('"flashinfer"', '"triton"', 1) == INVENTORY


def test_inline_host_tables_get_inline_children():
    text = 'hosts.gpu3 = { address = "10.0.0.3", stack = { server = { tp = 4 } } }\n'
    data = tomllib.loads(set_host_server_keys(text, "gpu3", {"speculative.algorithm": "none"}))
    assert data["hosts"]["gpu3"]["stack"]["server"] == {"tp": 4, "speculative": {"algorithm": "none"}}


def test_unknown_host_or_a_non_table_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="host 'gpu9'.*no \\[hosts.<name>\\] entry"):
        set_host_server_keys(INVENTORY, "gpu9", {"attention_backend": "x"}, path="hosts.toml")
    bad = INVENTORY + '\n[hosts.gpu3]\naddress = "x"\nstack = "oops"\n'
    with pytest.raises(ConfigError, match="field 'hosts.gpu3.stack.server'.*stack is not a table"):
        set_host_server_keys(bad, "gpu3", {"attention_backend": "x"}, path="hosts.toml")


def test_the_file_is_rewritten_atomically_with_its_mode(tmp_path):
    path = tmp_path / "hosts.toml"
    path.write_text(INVENTORY)
    path.chmod(0o640)
    write_host_server_keys(path, "gpu1", {"attention_backend": "triton"})
    assert tomllib.loads(path.read_text())["hosts"]["gpu1"]["stack"]["server"] == {"attention_backend": "triton"}
    assert path.stat().st_mode & 0o777 == 0o640 and [p.name for p in tmp_path.iterdir()] == ["hosts.toml"]
