"""parse_facts: the facts script's whole output -> HostFacts, recording unreadable sections as problems."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gpufleet.errors import FactError
from gpufleet.facts.model import HostFacts
from gpufleet.facts.registry import FACT_SECTIONS
from gpufleet.facts.sections import Section, parse_sections, script_note

T = TypeVar("T")


class _Reader:
    """Runs one parser per section and turns its FactError into a problem sentence."""

    def __init__(self, host: str, sections: dict[str, Section]):
        self.host, self.sections, self.problems = host, sections, []

    def read(self, name: str, what: str, parser: Callable[[str, str], T]) -> T | None:
        section = self.sections.get(name)
        try:
            if section is None:
                raise FactError(what, self.host, f"section {name!r} missing from the facts output")
            if section.rc == 124:
                raise FactError(what, self.host, f"section {name!r} timed out")
            return parser(section.text, self.host)
        except FactError as exc:
            self._problem(exc, section)
        except Exception as exc:  # a parser bug must not cost the other sections
            self._problem(FactError(what, self.host, f"unexpected output ({type(exc).__name__}: {exc})"), section)
        return None

    def _problem(self, exc: FactError, section: Section | None) -> None:
        text = str(exc)
        # the script's own `gpufleet: ...` note already says why; an exit code adds nothing to it
        if section is not None and section.rc not in (0, 124) and script_note(section.text) is None:
            text += f" (exit code {section.rc})"
        if text not in self.problems:
            self.problems.append(text)


def parse_facts(host: str, text: str) -> HostFacts:
    """Parse the facts script's output for one host, section by section; never raises for a broken section."""
    r = _Reader(host, parse_sections(text))
    fields: dict = {}
    read: set[str] = set()
    for section in FACT_SECTIONS:
        if section.after is not None and section.after not in read:
            continue
        value = r.read(section.name, section.what, section.parse)
        if value is not None:
            fields.update(section.fill(value, fields))
            read.add(section.name)
    return HostFacts(host=host, **fields, problems=r.problems)
