"""The unit section parser, with and without systemd."""

import pytest

from gpufleet.errors import FactError
from gpufleet.facts import facts_script, parse_unit, unit_name

SHA = "a" * 64


def test_installed_and_running():
    unit = parse_unit(f"systemd=present\nenabled=enabled\nactive=active\npath=/etc/systemd/system/sglang.service\n"
                      f"sha256={SHA}\n", "h")
    assert (unit.systemd, unit.present, unit.enabled, unit.active, unit.sha256) == (True, True, "enabled", "active",
                                                                                    SHA)
    assert unit.path == "/etc/systemd/system/sglang.service"


def test_not_installed_with_systemd():
    unit = parse_unit("systemd=present\nenabled=\nactive=inactive\npath=\n", "h")
    assert (unit.present, unit.enabled, unit.active, unit.sha256, unit.path) == (False, "not-found", "inactive", None,
                                                                                 None)


def test_without_systemd_file_still_seen():
    unit = parse_unit(f"systemd=absent\npath=/etc/systemd/system/sglang.service\nsha256={SHA}\n", "h")
    assert (unit.systemd, unit.present, unit.enabled, unit.active) == (False, True, "unknown", "unknown")


@pytest.mark.parametrize("text, detail", [
    ("", "unexpected output ''"), ("systemd=present\nsha256=xyz\n", "bad sha256")])
def test_broken(text, detail):
    with pytest.raises(FactError, match=f"could not read systemd unit on host h: {detail}"):
        parse_unit(text, "h")


def test_unit_name():
    assert unit_name("sglang") == "sglang.service" and unit_name("sglang.service") == "sglang.service"
    assert "gf_unit sglang.service" in facts_script("/v", "/c", "sglang", [])
