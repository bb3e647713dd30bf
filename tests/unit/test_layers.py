"""Imports point down: a module never imports gpufleet code of a higher layer (read from the source with ast)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A module may import its own layer and any layer below it.
LAYERS = [
    ("gpufleet.remote",),  # scripts shipped to hosts: standard library only
    ("gpufleet.errors", "gpufleet.cachedir"),  # the control node's cache folder and its memos: standard library only
    ("gpufleet.config",),
    ("gpufleet.engine",),
    ("gpufleet.facts",),
    ("gpufleet.wheels", "gpufleet.kernel"),
    ("gpufleet.plan", "gpufleet.roleapi"),  # the roles' contract: what a role returns and what it declares
    ("gpufleet.roles",),
    ("gpufleet.fleet",),  # the executor, rolls, health: runs roles
    ("gpufleet.probe",),  # the backend probe: uses fleet (health) and roles (model_server)
    ("gpufleet.sim", "gpufleet.testing"),  # the simulated fleet and the test kit: anything but the command line
    ("gpufleet.cli", "gpufleet.sim.cli", "gpufleet"),  # commands (sim.cli is the sim.* tasks' module)
]

# Known violations, each to be fixed and removed (test_known_violations_still_exist fails when one is stale).
KNOWN: set[tuple[str, str]] = set()


def layer_of(module: str) -> int:
    """The layer of the longest matching prefix (gpufleet.sim.cli is a command module, the rest of sim is not)."""
    best, found = -1, None
    for number, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), number
    assert found is not None, f"{module} is in no layer: add it to LAYERS"
    return found


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name; roles/ is installed as gpufleet.roles."""
    found = {}
    for base, package in ((ROOT / "gpufleet", "gpufleet"), (ROOT / "roles", "gpufleet.roles")):
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            if rel.parts[0] in ("roles", "payload") or "payload" in rel.parts:  # the symlink; sim's stand-in sglang
                continue
            parts = [package, *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The gpufleet modules `module` imports anywhere in its file (top level, in functions, under TYPE_CHECKING);
    `from gpufleet.fleet import lockstate` counts as importing the module gpufleet.fleet.lockstate."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for alias in node.names:
                out.add(f"{name}.{alias.name}" if f"{name}.{alias.name}" in known else name)
    return {m for m in out if m == "gpufleet" or m.startswith("gpufleet.")}


def edges() -> set[tuple[str, str]]:
    found = modules()
    return {(m, target) for m, path in found.items() for target in imports(m, path, set(found))}


def violations() -> set[tuple[str, str]]:
    return {(m, t) for m, t in edges() if t != "gpufleet" and layer_of(t) > layer_of(m)}


def test_every_module_has_a_layer():
    for module in modules():
        layer_of(module)


def test_imports_point_down():
    found = violations() - KNOWN
    assert not found, "imports of a higher layer:\n" + "\n".join(f"  {m} -> {t}" for m, t in sorted(found))


def test_known_violations_still_exist():
    stale = KNOWN - violations()
    assert not stale, f"fixed, remove from KNOWN: {sorted(stale)}"


@pytest.mark.parametrize("package", ["gpufleet.fleet", "gpufleet.sim", "gpufleet.config", "gpufleet.engine",
                                     "gpufleet.facts", "gpufleet.probe"])
def test_no_import_cycles_inside(package):
    """Two modules of one package never import each other, directly or around a loop."""
    inside = {(m, t) for m, t in edges() if m.startswith(package + ".") and t.startswith(package + ".") and m != t}
    graph: dict[str, set[str]] = {}
    for m, t in inside:
        graph.setdefault(m, set()).add(t)
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                loop = trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt]
                raise AssertionError("import cycle: " + " -> ".join(loop))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
