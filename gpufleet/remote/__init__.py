"""Code that runs on the hosts, shipped as files and loaded with importlib.resources."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def text(name: str) -> str:
    """The text of one remote file (`facts.sh`, `model_check.py`): sent to hosts as an argument, never installed."""
    return resources.files(__name__).joinpath(name).read_text()


def names() -> list[str]:
    """Every remote file, for the tests that parse them all."""
    return sorted(p.name for p in resources.files(__name__).iterdir() if p.name.endswith((".sh", ".py"))
                  and p.name != "__init__.py")


# What a program() starts with: the shipped modules, each compiled only when first imported (a check answered from
# its memo imports none of them; compiling them all costs a few ms of the host's CPU every time).
_SHIPPED = """import sys
class _Shipped:
    sources = %r
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in cls.sources:
            from importlib.machinery import ModuleSpec
            return ModuleSpec(name, cls)
    @staticmethod
    def create_module(spec):
        return None
    @classmethod
    def exec_module(cls, module):
        exec(compile(cls.sources[module.__name__], module.__name__ + ".py", "exec"), module.__dict__)
sys.meta_path.insert(0, _Shipped)
"""


def program(main: str, *modules: str) -> str:
    """A `python -c` program: the remote file `main`, with each of `modules` (remote files) importable under its own
    name, as when the files run side by side (the unit tests run them so)."""
    sources = {file.removesuffix(".py"): text(file) for file in modules}
    return (_SHIPPED % (sources,) if sources else "") + text(main)
