"""[router] in the inventory, the worker load parsers, the speed verdict and the router column of `inv status`."""

from __future__ import annotations

import json

import pytest

from gpufleet.config.inventory import load_inventory
from gpufleet.errors import ConfigError
from gpufleet.fleet import inflight, router_status, speed
from gpufleet.fleet.router import Worker

HOSTS = '[hosts.gpu1]\naddress = "10.0.0.1"\n[hosts.gpu2]\naddress = "10.0.0.2"\n'


def load(tmp_path, text: str):
    path = tmp_path / "hosts.toml"
    path.write_text(HOSTS + text)
    return load_inventory(path)


def test_router_with_tunnel_and_key_file(tmp_path):
    key = tmp_path / "key"
    key.write_text("router-secret\n")
    inv = load(tmp_path, f'[router]\nadmin_url = "http://10.0.0.9:30000/"\nvia = "gpu1"\napi_key_file = "{key}"\n'
                         'drain_timeout = 60\non_drain_timeout = "wait"\n')
    assert inv.router.admin_url == "http://10.0.0.9:30000" and inv.router.via == "gpu1"
    assert inv.router.api_key == "router-secret" and "router-secret" not in repr(inv.router)
    assert (inv.router.drain_timeout, inv.router.on_drain_timeout) == (60, "wait")


def test_no_router_table_means_no_router(tmp_path):
    assert load(tmp_path, "").router is None


@pytest.mark.parametrize("body, field, words", [
    ('admin_url = "ftp://x"', "router.admin_url", "http:// or https://"),
    ('admin_url = "http://x:30000/v1"', "router.admin_url", "scheme://host:port only"),
    ('admin_url = "http://user:pw@x"', "router.admin_url", "must not carry credentials"),
    ('admin_url = "http://x"\nvia = "gpu9"', "router.via", "must name an inventory host"),
    ('admin_url = "http://x"\napi_key_env = "GFG_UNSET_VAR_FOR_TEST"', "router.api_key_env", "unset or empty"),
    ('admin_url = "http://x"\napi_key_env = "A"\napi_key_file = "k"', "router.api_key_env", "not both"),
    ('admin_url = "http://x"\napi_key_file = "/nonexistent/key"', "router.api_key_file", "cannot read"),
    ('admin_url = "http://x"\ndrain_timeout = 0', "router.drain_timeout", "greater than 0"),
    ('admin_url = "http://x"\non_drain_timeout = "later"', "router.on_drain_timeout", "'cut' or 'wait'"),
    ('admin_url = "http://x"\ncolour = 1', "router.colour", "unknown key"),
    ('via = "gpu1"', "router.admin_url", "required field is missing"),
])
def test_router_mistakes_are_one_line_naming_file_field_value(tmp_path, monkeypatch, body, field, words):
    monkeypatch.delenv("GFG_UNSET_VAR_FOR_TEST", raising=False)
    with pytest.raises(ConfigError) as err:
        load(tmp_path, "[router]\n" + body + "\n")
    text = str(err.value)
    assert "\n" not in text and str(tmp_path / "hosts.toml") in text and f"field {field!r}" in text and words in text


def test_a_host_worker_url_is_validated(tmp_path):
    with pytest.raises(ConfigError, match="host 'gpu1', field 'worker_url'"):
        path = tmp_path / "h.toml"
        path.write_text('[hosts.gpu1]\naddress = "10.0.0.1"\nworker_url = "10.0.0.1:30000"\n')
        load_inventory(path)


def test_router_not_a_table_is_refused(tmp_path):
    path = tmp_path / "h.toml"
    path.write_text('router = "http://x"\n' + HOSTS)
    with pytest.raises(ConfigError, match="field 'router': must be a table"):
        load_inventory(path)


def test_get_load_sums_requests_over_dp_ranks_and_metrics_over_label_sets():
    assert inflight.parse_get_load([{"dp_rank": 0, "num_reqs": 2}, {"dp_rank": 1, "num_reqs": 3}]) == 5
    assert inflight.parse_get_load({"num_reqs": 1}) == 1
    with pytest.raises(inflight.LoadUnknown):
        inflight.parse_get_load([{"dp_rank": 0}])
    text = ('# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank="0",dp="0"} 2.0\n'
            'sglang:num_running_reqs{tp_rank="0",dp="1"} 1.0\nsglang:num_queue_reqs{tp_rank="0"} 4.0\n'
            'sglang:num_running_reqs_other 9\n')
    assert inflight.parse_metrics(text) == 7
    with pytest.raises(inflight.LoadUnknown, match="--enable-metrics"):
        inflight.parse_metrics("python_gc_objects_collected_total 1\n")


def test_speed_verdict_uses_the_threshold_and_refuses_different_shapes():
    old = speed.Speed(100.0, 1, 512, 512, 5.12)
    assert speed.verdict(old, speed.Speed(91.0, 1, 512, 512, 5.6), 10.0) is None
    assert "30.0% slower" in speed.verdict(old, speed.Speed(70.0, 1, 512, 512, 7.3), 10.0)
    assert speed.verdict(old, speed.Speed(120.0, 1, 512, 512, 4.2), 0.0) is None
    assert "differ in shape" in speed.verdict(old, speed.Speed(100.0, 4, 512, 2048, 20.0), 10.0)


def test_router_state_in_unhealthy_drained_absent(tmp_path):
    listed = {"http://a:1": Worker("1", "http://a:1", "m", True), "http://b:1": Worker("2", "http://b:1", "m", False)}
    assert router_status.router_state("http://a:1", listed, None) == "in"
    assert router_status.router_state("http://b:1", listed, None) == "unhealthy"
    out = {"router": {"taken_out": True, "state": "out"}}
    assert router_status.router_state("http://c:1", listed, out) == "drained"
    assert router_status.router_state("http://c:1", listed, {"router": {"taken_out": True, "state": "in"}}) == "absent"
    assert router_status.router_state("http://c:1", listed, None) == "absent"


def test_last_roll_results_take_each_host_from_its_newest_record(tmp_path):
    for stamp, tps in (("20260101T000000Z", 10.0), ("20260102T000000Z", 20.0)):
        (tmp_path / stamp).mkdir()
        (tmp_path / stamp / "summary.json").write_text(json.dumps({"results": [
            {"host": "gpu1", "speed": {"before": {"tokens_per_second": tps - 1}, "after": {"tokens_per_second": tps}}}]}))
    hosts = [type("H", (), {"name": "gpu1"})(), type("H", (), {"name": "gpu2"})()]
    cells = router_status.speed_cells(hosts, tmp_path)
    assert cells["gpu1"].current == "20.0 tok/s" and not cells["gpu1"].drift and "gpu2" not in cells
