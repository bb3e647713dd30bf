"""Fleet locks: file validation, render/save/load, constraints, comparing a host, and the locked stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.config import lock
from gpufleet.config.series import patches_digest
from gpufleet.errors import ConfigError
from gpufleet.config.lock import FleetLock, LockKernel, LockMeta, LockSglang, LockWheel
from gpufleet.config.stack import Stack, load_stack
from gpufleet.fleet.lockstate import locked_stack

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SG_PATCHES = "a" * 64
SK_PATCHES = "b" * 64
BUILD = "c" * 64
WHEEL_SHA = "d" * 64
TORCH = "2.12.0.dev20260307+cu130"

VALID = f"""
[lock]
format = 1
created = "2026-03-08T10:00:00Z"
canary = "gpu1"
command = "inv roll"

[sglang]
commit = "{COMMIT}"
patches = "{SG_PATCHES}"

[sgl_kernel]
build_key = "{BUILD}"
patches = "{SK_PATCHES}"

[packages]
torch = "{TORCH}"
Flashinfer_Python = "0.6.5"
sglang = "0.5.9"
sgl-kernel = "0.3.16"

[[wheels]]
name = "torch"
version = "{TORCH}"
filename = "torch-2.12.0.dev20260307+cu130-py3-none-any.whl"
url = "http://10.0.0.1:8765/files/torch-2.12.0.dev20260307%2Bcu130-py3-none-any.whl"
sha256 = "{WHEEL_SHA}"
"""


def write(tmp_path: Path, text: str, name: str = "lock.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        lock.load(write(tmp_path, text))
    return info.value


def assert_names(err: ConfigError, *parts: str) -> None:
    text = str(err)
    for part in parts:
        assert part in text, f"{part!r} not in {text!r}"
    assert "\n" not in text and "pydantic" not in text


def made(packages: dict[str, str] | None = None, *, commit: str = COMMIT, build_key: str | None = BUILD,
         wheels: list[LockWheel] = (), sg_patches: str = SG_PATCHES, sk_patches: str = SK_PATCHES,
         path: str = "/locks/x.toml") -> FleetLock:
    return FleetLock(lock=LockMeta(format=1, created="2026-03-08T10:00:00Z", canary="gpu1"),
                     sglang=LockSglang(commit=commit, patches=sg_patches),
                     sgl_kernel=LockKernel(build_key=build_key, patches=sk_patches),
                     packages=packages if packages is not None else {"torch": TORCH, "triton": "3.6.0"},
                     wheels=list(wheels), path=path)


# --- load: a valid file ----------------------------------------------------------------------------------------

def test_valid_lock_loads_with_names_canonicalised_and_its_path(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    found = lock.load(path)
    assert found.path == str(path)
    assert found.packages == {"torch": TORCH, "flashinfer-python": "0.6.5", "sglang": "0.5.9", "sgl-kernel": "0.3.16"}
    assert found.sglang.commit == COMMIT and found.sgl_kernel.build_key == BUILD
    assert found.lock.canary == "gpu1" and found.lock.command == "inv roll"
    assert [w.filename for w in found.wheels] == ["torch-2.12.0.dev20260307+cu130-py3-none-any.whl"]


def test_a_lock_without_build_key_or_wheels_loads(tmp_path: Path) -> None:
    text = VALID.replace(f'build_key = "{BUILD}"\n', "").split("[[wheels]]")[0]
    found = lock.load(write(tmp_path, text))
    assert found.sgl_kernel.build_key is None and found.wheels == [] and found.file_hashes() == {}


# --- load: every problem names the file, the field and the value -----------------------------------------------

@pytest.mark.parametrize("old, new, field, value", [
    (f'patches = "{SG_PATCHES}"', 'patches = "not-a-sha"', "sglang.patches", "'not-a-sha'"),
    (f'build_key = "{BUILD}"', f'build_key = "{BUILD.upper()}"', "sgl_kernel.build_key", repr(BUILD.upper())),
    (f'sha256 = "{WHEEL_SHA}"', 'sha256 = "abc"', "wheels[0].sha256", "'abc'"),
    (f'commit = "{COMMIT}"', 'commit = "latest"', "sglang.commit", "'latest'"),
    (f'commit = "{COMMIT}"', 'commit = "abc12"', "sglang.commit", "'abc12'"),  # shorter than 7
    ('filename = "torch-2.12.0.dev20260307+cu130-py3-none-any.whl"', 'filename = "torch-2.12.tar.gz"',
     "wheels[0].filename", "'torch-2.12.tar.gz'"),
])
def test_bad_values_name_file_field_and_value(tmp_path: Path, old: str, new: str, field: str, value: str) -> None:
    assert old in VALID
    err = error(tmp_path, VALID.replace(old, new))
    assert_names(err, "lock.toml", f"field {field!r}", f"(got {value})")
    assert err.field == field


@pytest.mark.parametrize("old, new, field, value", [
    ('command = "inv roll"', 'command = "inv roll"\ncanary_host = "gpu2"', "lock.canary_host", "'gpu2'"),
    ('[packages]', '[sglang_extra]\nx = 1\n\n[packages]', "sglang_extra", "{'x': 1}"),
    (f'sha256 = "{WHEEL_SHA}"', f'sha256 = "{WHEEL_SHA}"\nsize = 3', "wheels[0].size", "3"),
])
def test_unknown_keys_are_refused(tmp_path: Path, old: str, new: str, field: str, value: str) -> None:
    err = error(tmp_path, VALID.replace(old, new))
    assert_names(err, "lock.toml", f"field {field!r}", "unknown key", f"(got {value})")


def test_unknown_key_lists_the_allowed_ones(tmp_path: Path) -> None:
    err = error(tmp_path, VALID.replace('command = "inv roll"', 'commandd = "inv roll"'))
    assert_names(err, "allowed keys: format, created, canary, command")


def test_another_format_number_is_refused_before_anything_else(tmp_path: Path) -> None:
    # a format-2 lock may well have other fields: the format is what to report, not the first unknown key
    err = error(tmp_path, VALID.replace("format = 1", "format = 2\nsigned_by = 'x'"))
    assert_names(err, "lock.toml", "field 'lock.format'", "lock format 2 is not 1", "another gpufleet version",
                 "(got 2)")


@pytest.mark.parametrize("drop, field", [
    ('canary = "gpu1"\n', "lock.canary"),
    ("format = 1\n", "lock.format"),
    (f'commit = "{COMMIT}"\n', "sglang.commit"),
    (f'patches = "{SK_PATCHES}"\n', "sgl_kernel.patches"),
])
def test_missing_fields_are_named(tmp_path: Path, drop: str, field: str) -> None:
    assert drop in VALID
    err = error(tmp_path, VALID.replace(drop, ""))
    assert_names(err, "lock.toml", f"field {field!r}", "required field is missing")


def test_missing_packages_table_is_named(tmp_path: Path) -> None:
    text = VALID.split("[packages]")[0]
    assert_names(error(tmp_path, text), "lock.toml", "field 'packages'", "required field is missing")


def test_lock_that_is_not_a_table_is_a_config_error(tmp_path: Path) -> None:
    err = error(tmp_path, 'lock = "gpu1"\n[sglang]' + VALID.split("[sglang]", 1)[1])
    assert_names(err, "lock.toml", "field 'lock'", "(got 'gpu1')")


def test_missing_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="none.toml: file does not exist"):
        lock.load(tmp_path / "none.toml")
    assert_names(error(tmp_path, "[lock\nformat = 1\n"), "lock.toml", "invalid TOML", "line 1")


# --- render, save, load ----------------------------------------------------------------------------------------

def test_save_then_load_round_trips(tmp_path: Path) -> None:
    wheels = [LockWheel(name="triton", version="3.6.0", filename="triton-3.6.0-py3-none-any.whl", sha256="e" * 64),
              LockWheel(name="torch", version=TORCH, filename=f"torch-{TORCH}-py3-none-any.whl",
                        url="http://10.0.0.1/files/torch.whl", sha256=WHEEL_SHA)]
    original = made({"torch": TORCH, "Jinja2": "3.1.6", "typing_extensions": "4.15.0", "zope.interface": "8.0"},
                    wheels=wheels)
    path = lock.save(original, tmp_path / "locks", "20260308T100000Z")
    assert path == tmp_path / "locks" / "20260308T100000Z-gpu1.toml"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    again = lock.load(path)
    assert again.path == str(path)
    assert again.packages == {"torch": TORCH, "jinja2": "3.1.6", "typing-extensions": "4.15.0",
                              "zope-interface": "8.0"}
    assert again.model_dump(exclude={"packages", "wheels"}) == original.model_dump(exclude={"packages", "wheels"})
    assert sorted(again.wheels, key=lambda w: w.filename) == sorted(wheels, key=lambda w: w.filename)
    assert again.file_hashes() == {"triton-3.6.0-py3-none-any.whl": "e" * 64,
                                   f"torch-{TORCH}-py3-none-any.whl": WHEEL_SHA}


def test_render_starts_with_its_header_and_sorts(tmp_path: Path) -> None:
    wheels = [LockWheel(name="z", version="1", filename="z-1-py3-none-any.whl", sha256="e" * 64),
              LockWheel(name="a", version="1", filename="a-1-py3-none-any.whl", sha256="f" * 64)]
    text = lock.render(made({"zlib-ng": "1", "aiohttp": "3"}, wheels=wheels), note="recorded by inv roll")
    lines = text.splitlines()
    assert lines[0] == "# gpufleet fleet lock: the stack of a canary that passed its health gate."
    assert lines[1].startswith("# `inv upgrade --lock THIS`") and lines[2] == "# recorded by inv roll"
    assert text.index('aiohttp = "3"') < text.index('zlib-ng = "1"')
    assert text.index('filename = "a-1-py3-none-any.whl"') < text.index('filename = "z-1-py3-none-any.whl"')
    assert "/locks/x.toml" not in text and "path" not in text  # where it was read from is not part of it


def test_render_without_wheels_or_build_key_keeps_the_header_first(tmp_path: Path) -> None:
    text = lock.render(made(build_key=None))
    assert text.startswith("# gpufleet fleet lock:")
    assert "build_key" not in text
    again = lock.load(write(tmp_path, text))
    assert again.wheels == [] and again.sgl_kernel.build_key is None


def test_locks_dir_comes_from_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GPUFLEET_LOCKS_DIR", raising=False)
    assert lock.locks_dir(tmp_path / "repo-locks") == tmp_path / "repo-locks"
    monkeypatch.setenv("GPUFLEET_LOCKS_DIR", str(tmp_path / "elsewhere"))
    assert lock.locks_dir(tmp_path / "repo-locks") == tmp_path / "elsewhere"


# --- constraints and file hashes -------------------------------------------------------------------------------

def test_constraints_pin_everything_but_sglang_and_sgl_kernel(tmp_path: Path) -> None:
    found = lock.load(write(tmp_path, VALID))
    assert found.constraints() == ["flashinfer-python==0.6.5", f"torch=={TORCH}"]


def test_file_hashes_map_each_filename_to_its_sha256() -> None:
    found = made(wheels=[LockWheel(name="a", version="1", filename="a-1-py3-none-any.whl", sha256="1" * 64),
                         LockWheel(name="b", version="2", filename="b-2-py3-none-any.whl", sha256="2" * 64)])
    assert found.file_hashes() == {"a-1-py3-none-any.whl": "1" * 64, "b-2-py3-none-any.whl": "2" * 64}


# --- compare ---------------------------------------------------------------------------------------------------

def test_host_at_the_lock_matches() -> None:
    drift = lock.compare(made(), "gpu2", {"torch": TORCH, "triton": "3.6.0"}, COMMIT, BUILD)
    assert drift.matches and drift.packages == [] and drift.other == [] and drift.extra == []
    assert drift.to_json() == {"host": "gpu2", "matches": True, "packages": [], "other": [], "extra": []}


def test_absent_and_different_packages_are_listed() -> None:
    drift = lock.compare(made({"torch": TORCH, "triton": "3.6.0", "numpy": "2.3.0"}), "gpu2",
                         {"torch": "2.9.1+cu130", "numpy": "2.3.0"}, COMMIT, BUILD)
    assert not drift.matches
    assert drift.packages == [f"torch: 2.9.1+cu130 (lock: {TORCH})", "triton: absent (lock: 3.6.0)"]
    assert drift.other == [] and drift.to_json()["matches"] is False


def test_extras_are_listed_but_do_not_break_a_match() -> None:
    drift = lock.compare(made(), "gpu2", {"torch": TORCH, "triton": "3.6.0", "Rich": "15.0.0"}, COMMIT, BUILD)
    assert drift.extra == ["rich: 15.0.0 is not in the lock"]
    assert drift.matches


def test_host_names_are_canonicalised_before_comparing() -> None:
    found = made({"typing-extensions": "4.15.0"})
    assert lock.compare(found, "gpu2", {"Typing_Extensions": "4.15.0"}, COMMIT, BUILD).matches


@pytest.mark.parametrize("have, same", [
    ("2.12.0.dev20260307", True),            # pip without the +cu130 label: the public part decides
    ("2.12.0.dev20260307+cu128", False),     # another local label is another build
    ("2.12.0.dev20260306", False),
])
def test_version_without_local_label(have: str, same: bool) -> None:
    drift = lock.compare(made({"torch": TORCH}), "gpu2", {"torch": have}, COMMIT, BUILD)
    assert drift.matches is same
    assert drift.packages == ([] if same else [f"torch: {have} (lock: {TORCH})"])


def test_a_label_on_the_host_that_the_lock_lacks_is_a_difference() -> None:
    drift = lock.compare(made({"torch": "2.11.0"}), "gpu2", {"torch": "2.11.0+cu130"}, COMMIT, BUILD)
    assert drift.packages == ["torch: 2.11.0+cu130 (lock: 2.11.0)"]


@pytest.mark.parametrize("lock_commit, head, same", [
    (COMMIT, COMMIT, True),
    (COMMIT[:7], COMMIT, True),       # the lock names a short sha
    (COMMIT, COMMIT[:12], True),      # the host reports a short sha
    (COMMIT, "f" + COMMIT[1:], False),
    (COMMIT[:7], "f" * 40, False),
])
def test_sglang_commit_prefixes(lock_commit: str, head: str, same: bool) -> None:
    drift = lock.compare(made(commit=lock_commit), "gpu2", {"torch": TORCH, "triton": "3.6.0"}, head, BUILD)
    assert drift.matches is same
    assert drift.other == ([] if same else [f"sglang commit {head[:12]} (lock: {lock_commit[:12]})"])


def test_unreadable_checkout_is_a_difference() -> None:
    drift = lock.compare(made(), "gpu2", {"torch": TORCH, "triton": "3.6.0"}, None, BUILD)
    assert drift.other == ["sglang checkout: unreadable"] and not drift.matches


def test_another_or_unknown_sgl_kernel_build_is_a_difference() -> None:
    packages = {"torch": TORCH, "triton": "3.6.0"}
    assert lock.compare(made(), "gpu2", packages, COMMIT, "9" * 64).other == [
        f"sgl-kernel build {'9' * 12} (lock: {BUILD[:12]})"]
    assert lock.compare(made(), "gpu2", packages, COMMIT, None).other == [
        f"sgl-kernel build unknown (lock: {BUILD[:12]})"]
    # a lock recorded without a build key does not judge the build
    assert lock.compare(made(build_key=None), "gpu2", packages, COMMIT, None).matches


# --- locked_stack ----------------------------------------------------------------------------------------------

def patch_dir(path: Path, body: str = "--- a/x\n+++ b/x\n") -> Path:
    path.mkdir(parents=True)
    (path / "series").write_text("0001-fix.patch\n")
    (path / "0001-fix.patch").write_text(body)
    return path


@pytest.fixture
def site(tmp_path: Path) -> Stack:
    patch_dir(tmp_path / "patches" / "sglang")
    patch_dir(tmp_path / "patches" / "sgl-kernel", "--- a/CMakeLists.txt\n+++ b/CMakeLists.txt\n")
    (tmp_path / "stack.toml").write_text('[torch]\nversion = "2.9.1+cu130"\n[flashinfer]\nversion = "0.6.4"\n'
                                         '[sglang]\ncommit = "latest"\n')
    return load_stack(tmp_path / "stack.toml")


def proven(stack: Stack, packages: dict[str, str], **kw) -> FleetLock:
    return made(packages, sg_patches=patches_digest(stack.sglang.patches),
                sk_patches=patches_digest(stack.sgl_kernel.patches), **kw)


def test_the_lock_wins_over_the_stack(site: Stack) -> None:
    found = proven(site, {"torch": TORCH, "flashinfer-python": "0.6.5", "flashinfer-jit-cache": "0.6.5+cu129"})
    got = locked_stack(site, found, "gpu2")
    assert got.torch.version == TORCH
    assert got.flashinfer.version == "0.6.5" and got.flashinfer.jit_cache.local_version == "cu129"
    assert got.flashinfer.jit_cache_version == "0.6.5+cu129"
    assert got.sglang.commit == COMMIT
    # the rest is the site's
    assert got.sglang.patches == site.sglang.patches and got.server == site.server
    assert got.flashinfer.jit_cache.index_url == site.flashinfer.jit_cache.index_url


def test_a_jit_cache_without_label_drops_the_stacks_label(site: Stack) -> None:
    got = locked_stack(site, proven(site, {"flashinfer-jit-cache": "0.6.5"}))
    assert got.flashinfer.jit_cache.local_version is None


def test_what_the_lock_does_not_name_stays_the_stacks(site: Stack) -> None:
    got = locked_stack(site, proven(site, {"numpy": "2.3.0"}))
    assert got.torch.version == "2.9.1+cu130" and got.flashinfer.version == "0.6.4"
    assert got.flashinfer.jit_cache.local_version == site.flashinfer.jit_cache.local_version == "cu130"
    assert got.sglang.commit == COMMIT


@pytest.mark.parametrize("section, dirname", [("sglang", "sglang"), ("sgl_kernel", "sgl-kernel")])
def test_changed_patches_are_refused_naming_the_lock_file_and_field(site: Stack, tmp_path: Path, section: str,
                                                                    dirname: str) -> None:
    found = proven(site, {"torch": TORCH}, path=str(tmp_path / "locks" / "20260308-gpu1.toml"))
    recorded = getattr(found, section).patches
    (tmp_path / "patches" / dirname / "0001-fix.patch").write_text("--- a/y\n+++ b/y\n")
    with pytest.raises(ConfigError) as info:
        locked_stack(site, found, "gpu2")
    err = info.value
    assert err.path == found.path and err.field == f"{section}.patches" and err.host == "gpu2"
    assert_names(err, "20260308-gpu1.toml", f"field '{section}.patches'", "not the one this lock was proven with",
                 str(tmp_path / "patches" / dirname), f"(got {recorded!r})")


def test_a_series_that_lists_another_patch_is_refused(site: Stack) -> None:
    found = proven(site, {"torch": TORCH})
    (site.sglang.patches / "0002-more.patch").write_text("--- a/z\n")
    locked_stack(site, found)  # a file the series does not name is not part of it
    (site.sglang.patches / "series").write_text("0001-fix.patch\n0002-more.patch\n")
    with pytest.raises(ConfigError, match="field 'sglang.patches'"):
        locked_stack(site, found)


# --- inv status --lock: the table ------------------------------------------------------------------------------

def rendered(found: FleetLock, rows) -> str:
    from rich.console import Console

    from gpufleet.cli.lock_status import table

    console = Console(record=True, width=200)
    console.print(table(found, rows))
    return console.export_text()


def row_of(text: str, host: str) -> list[str]:
    """The cells of a host's first table line."""
    [line] = [ln for ln in text.splitlines() if f" {host} " in ln]
    return [cell.strip() for cell in line.strip().strip("│").split("│")]


def test_status_table_shows_matching_drifting_and_unreachable_hosts() -> None:
    found = made()
    packages = {"torch": TORCH, "triton": "3.6.0"}
    rows = [("gpu1", lock.compare(found, "gpu1", {**packages, "rich": "15.0.0"}, COMMIT, BUILD), None),
            ("gpu2", lock.compare(found, "gpu2", {"torch": "2.9.1+cu130"}, "f" * 40, BUILD), None),
            ("gpu3", None, "cannot connect to 10.0.0.3:22: [Errno 111] Connection refused")]
    text = rendered(found, rows)
    assert "gpu1" in text and "differences" in text  # the lock itself is named in a line above the table
    assert row_of(text, "gpu1") == ["gpu1", "yes", "rich: 15.0.0 is not in the lock"]
    assert "rich: 15.0.0 is not in the lock" in text  # shown, yet gpu1 matches
    assert row_of(text, "gpu2") == ["gpu2", "no", f"torch: 2.9.1+cu130 (lock: {TORCH})"]
    for line in ("triton: absent (lock: 3.6.0)", f"sglang commit {'f' * 12} (lock: {COMMIT[:12]})"):
        assert line in text
    assert row_of(text, "gpu3") == ["gpu3", "unreachable",
                                    "cannot connect to 10.0.0.3:22: [Errno 111] Connection refused"]


def test_status_table_says_none_for_a_host_without_differences() -> None:
    found = made()
    text = rendered(found, [("gpu1", lock.compare(found, "gpu1", {"torch": TORCH, "triton": "3.6.0"}, COMMIT,
                                                  BUILD), None)])
    assert row_of(text, "gpu1") == ["gpu1", "yes", "none"]


def test_status_table_escapes_markup_in_what_hosts_report() -> None:
    found = made({"torch": TORCH})
    rows = [("gpu1", lock.compare(found, "gpu1", {"torch": "[bold]2.9[/bold]"}, COMMIT, BUILD), None),
            ("gpu2", None, "error [red]x[/red]")]
    text = rendered(found, rows)
    assert f"torch: [bold]2.9[/bold] (lock: {TORCH})" in text and "error [red]x[/red]" in text
