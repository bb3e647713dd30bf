"""Fuzzed inventory, stack and lock files through the real loaders: each loads, or fails with one ConfigError whose
message is one printable line naming the file and the field; never a traceback or another exception type."""

from __future__ import annotations

import copy
import datetime
import math
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomlkit
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpufleet.config import lock
from gpufleet.config.inventory import Host, Settings, load_inventory
from gpufleet.config.stack import Stack, host_stacks, load_stack
from gpufleet.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
# Deterministic (CI sees the same cases every run), no example database written into the checkout, no deadline:
# a loaded file's cost is the loaders', not what this test is about.
FUZZ = settings(max_examples=150, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INVENTORY = """
[settings]
parallelism = 4
connect_timeout = 5
keepalive = 15
known_hosts = "kh"
accept_new_host_keys = true
command_timeout = 600
snapshots_keep = 3

[defaults]
user = "root"
venv = "/root/venv"
sglang_checkout = "/root/sglang-main"
service = "sglang"
model_path = "/models/m"
gpus = { count = 8, compute_capability = "12.0", name = "RTX PRO 6000" }

[defaults.stack.server]
port = 31000
extra_args = ["--log-level", "info"]

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
become = true
become_user = "root"

[hosts.gpu3]
address = "10.0.0.3"
jump = "ops@bastion:2200"
groups = ["rack-b"]

[hosts.gpu3.stack.server]
attention_backend = "flashinfer"
mem_fraction_static = 0.8
env = { NCCL_DEBUG = "INFO" }

[hosts.gpu3.stack.flashinfer.jit_cache]
url = "https://example.net/flashinfer_jit_cache-0.6.5+cu130-cp39-abi3-manylinux_2_28_x86_64.whl"
sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
"""

LOCK = f"""
[lock]
format = 1
created = "2026-03-08T10:00:00Z"
canary = "gpu1"
command = "inv upgrade --hosts all"

[sglang]
commit = "{'0' * 40}"
patches = "{'a' * 64}"

[sgl_kernel]
build_key = "{'c' * 64}"
patches = "{'b' * 64}"

[packages]
torch = "2.12.0.dev20260307+cu130"
flashinfer-python = "0.6.5"

[[wheels]]
name = "torch"
version = "2.12.0.dev20260307+cu130"
filename = "torch-2.12.0.dev20260307+cu130-py3-none-any.whl"
url = "https://user:pass@index.example.net/files/torch.whl"
sha256 = "{'d' * 64}"
"""


def _stack_doc() -> dict:
    doc = tomllib.loads((REPO / "stack.toml").read_text())
    doc["sglang"]["patches"] = str(REPO / "patches/sglang")
    doc["sgl_kernel"]["patches"] = str(REPO / "patches/sgl-kernel")
    return doc


def _field_names(model, seen: set[str]) -> set[str]:
    """Every field name anywhere in a model tree: keys a fuzzed file puts at the wrong depth."""
    for name, info in model.model_fields.items():
        seen.add(name)
        for arg in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(arg, type) and hasattr(arg, "model_fields") and arg.__name__ not in seen:
                seen.add(arg.__name__)
                _field_names(arg, seen)
    return seen


KNOWN_KEYS = sorted(k for k in _field_names(Stack, set()) | _field_names(Host, set()) | _field_names(Settings, set())
                    if k[0].islower()) + ["stack", "hosts", "groups", "defaults", "settings", "lock", "wheels"]

# Strings that broke or could break a loader: home-directory forms, NUL, line breaks of every kind, shell
# metacharacters, terminal escapes, non-ASCII, huge.
NASTY = ["", " ", "\n", "a\nb", "\r", "\u2028", "\x85", "\x00", "\x1b[31mred", "~", "~nosuchuser/key",
         "~root/.ssh/id", "/", "//", "/.", "/..", "..", "relative/path", "$(touch /tmp/pwned)", "`id`", "a;b", "'\"",
         "\\", "%h", "$HOME", "-rf", "--flag", "=", "é", "日本語", "\U0001f600", "x" * 5000, "1e400", "inf", "nan",
         "http://", "http://user:pass@host/simple", "file:///", "git://h/x", "auto", "none", "NEXTN", "EAGLE3",
         "12.0", "12.0a", "latest", "0" * 40, "gpu1", "all", "rack-a", "ops@bastion:99999", "a@b@c", "[::1]",
         "sglang.service", "sglang@1", "2.12.0.dev20260307+cu130", "0.6.5", "cu130"]
FLOATS = [1e400, -1e400, math.inf, -math.inf, math.nan, 0.0, -0.0, 5e-324, 1.7976931348623157e308, 0.85, 1.0]
INTS = [0, -1, 1, 65535, 65536, 2**31, 2**63 - 1, -(2**63), 10**30]

scalars = st.one_of(
    st.sampled_from(NASTY), st.text(max_size=12), st.sampled_from(FLOATS), st.floats(), st.sampled_from(INTS),
    st.integers(), st.booleans(),
    st.datetimes(timezones=st.none() | st.just(datetime.timezone.utc)), st.dates(), st.times())
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.sampled_from(NASTY[:20]), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
                      max_leaves=5)


def _slots(doc, path=()) -> list[tuple]:
    """Every place in a document: each table and each value (list items included), as key paths."""
    found = [path]
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        found += _slots(value, path + (key,))
    return found


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutated(draw, base: dict) -> dict:
    """base with one to four mutations: a value replaced (wrong type, huge/NaN/inf, empty, unicode), a key removed,
    an extra or misplaced key added, a value wrapped in a table or a list, a table moved elsewhere."""
    doc = tomllib.loads(tomlkit.dumps(base))  # a deep copy
    for _ in range(draw(st.integers(1, 4))):
        slots = _slots(doc)
        path = draw(st.sampled_from(slots))
        kind = draw(st.sampled_from(["replace", "replace", "delete", "add", "wrap", "move"]))
        parent = _get(doc, path[:-1]) if path else None
        if kind == "add":
            target = _get(doc, path)
            if isinstance(target, dict):
                target[draw(keys)] = draw(values)
            continue
        if not path:
            continue
        key = path[-1]
        if kind == "replace":
            parent[key] = draw(values)
        elif kind == "delete":
            del parent[key]
        elif kind == "wrap":
            parent[key] = draw(st.sampled_from([[parent[key]], {draw(keys): parent[key]}]))
        elif kind == "move":
            moved = parent.pop(key) if isinstance(parent, dict) else copy.deepcopy(parent[key])  # never a cycle
            where = _get(doc, draw(st.sampled_from(_slots(doc))))
            if isinstance(where, dict):
                where[draw(keys)] = moved
    return doc


def _write(path: Path, doc: dict) -> bool:
    """Write doc as TOML; False when tomlkit cannot express it as a TOML file tomllib reads back (skipped)."""
    try:
        text = tomlkit.dumps(doc)
        tomllib.loads(text)
    except Exception:  # noqa: BLE001  (the generator's limits, not the loaders')
        return False
    path.write_text(text)
    return True


def assert_one_line_naming_file_and_field(path: Path, load) -> None:
    try:
        load()
    except ConfigError as exc:
        text = str(exc)
        assert text.isprintable() and len(text.splitlines()) == 1, text
        assert text.startswith(str(path)), text
        assert exc.field, f"no field named: {text}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


BASE_STACK = load_stack(REPO / "stack.toml")


@FUZZ
@given(doc=mutated(tomllib.loads(INVENTORY)))
@example(doc={**tomllib.loads(INVENTORY), "settings": {"connect_timeout": 1e400}})
@example(doc={**tomllib.loads(INVENTORY), "settings": {"keepalive": math.inf}})
@example(doc={**tomllib.loads(INVENTORY), "settings": {"known_hosts": "~nosuchuser/kh"}})
def test_fuzzed_inventory_loads_or_is_one_config_error(workdir, doc):
    path = workdir / "hosts.toml"
    if _write(path, doc):
        assert_one_line_naming_file_and_field(path, lambda: host_stacks(BASE_STACK, load_inventory(path)))


@FUZZ
@given(doc=mutated(_stack_doc()))
@example(doc={**_stack_doc(), "server": {"mem_fraction_static": math.nan}})
def test_fuzzed_stack_loads_or_is_one_config_error(workdir, doc):
    path = workdir / "stack.toml"
    if _write(path, doc):
        assert_one_line_naming_file_and_field(path, lambda: load_stack(path))


@settings(FUZZ, max_examples=80)
@given(doc=mutated(tomllib.loads(LOCK)))
def test_fuzzed_lock_loads_or_is_one_config_error(workdir, doc):
    path = workdir / "lock.toml"
    if _write(path, doc):
        assert_one_line_naming_file_and_field(path, lambda: lock.load(path))


BROKEN = {
    "connect_timeout = 1e400": ("[settings]\nconnect_timeout = 1e400\n", "settings.connect_timeout"),
    "keepalive = inf": ("[settings]\nkeepalive = inf\n", "settings.keepalive"),
    "a newline in the venv": ('[defaults]\nvenv = "/root/v\\nenv"\n', "venv"),
    "a service that is no unit name": ('[defaults]\nservice = "sglang;touch /tmp/x"\n', "service"),
    "a host that is a number": ("[hosts]\ngpu9 = 5\n", "hosts.gpu9"),
}


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_inv_status_with_a_broken_inventory_prints_one_line(tmp_path, case):
    extra, fld = BROKEN[case]
    path = tmp_path / "hosts.toml"
    doc = tomllib.loads(INVENTORY)
    for key, table in tomllib.loads(extra).items():
        doc[key] = {**doc.get(key, {}), **table}
    path.write_text(tomlkit.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "invoke", "status", "--inventory", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert out.startswith(f"error: {path}") and f"field {fld!r}" in out, out
