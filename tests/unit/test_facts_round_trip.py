"""Facts cost one exec round trip per host: gather_facts sends one command, whose answer fills every section."""

from pathlib import Path

from gpufleet.facts import SECTIONS
from gpufleet.facts.gather import gather_facts
from gpufleet.testing.session import FakeSession

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "sim-blackwell" / "facts.txt"


def test_one_command_answers_every_section():
    session = FakeSession({"facts": (0, FACTS.read_text())})
    facts = gather_facts(session)
    assert session.steps == ["facts"] and not session.channels and not session.puts  # one exec, nothing else
    assert facts.packages and facts.gpus and facts.checkout and facts.unit and facts.python_version
    script = session.calls[0][1].display()
    assert all(f"gf_section {name} " in script for name in SECTIONS if name != "packages")
    assert "-m pip" not in script  # the distributions are read from their metadata, not by running pip
