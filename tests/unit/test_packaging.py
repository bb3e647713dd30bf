"""pyproject.toml lists every package gpufleet has (find cannot see roles/, installed as gpufleet.roles)."""

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _listed() -> set[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"gpufleet.roles": "roles"}
    return set(config["packages"])


def test_every_package_directory_is_listed_and_nothing_else():
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "gpufleet").rglob("__init__.py")
             if "payload" not in p.parts and "roles" not in p.relative_to(REPO).parts}
    assert found | {"gpufleet.roles"} == _listed()


def test_roles_resolve_to_the_top_level_directory_in_a_checkout():
    import gpufleet.roles

    assert Path(gpufleet.roles.__file__).resolve() == REPO / "roles" / "__init__.py"
