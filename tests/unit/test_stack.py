"""Unit tests for stack.toml loading, validation messages and per-host overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import ConfigError
from gpufleet.config.inventory import load_inventory
from gpufleet.config.stack import Stack, host_stacks, load_stack, stack_for_host

REPO = Path(__file__).resolve().parents[2]
SHA = "a" * 64


def write(tmp_path: Path, text: str, name: str = "stack.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    for part in ("patches/sglang", "patches/sgl-kernel", "p/sg"):  # every patch directory these tests name
        (tmp_path / part).mkdir(parents=True, exist_ok=True)
        (tmp_path / part / "series").touch()
    return path


def load(tmp_path: Path, text: str) -> Stack:
    return load_stack(write(tmp_path, text))


def error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return info.value


def override_error(stack: Stack, overrides: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        stack_for_host(stack, overrides, source="/inv/hosts.toml", host="gpu2")
    return info.value


def assert_names(err: ConfigError, *parts: str) -> None:
    text = str(err)
    for part in parts:
        assert part in text, f"{part!r} not in {text!r}"
    assert "\n" not in text and "pydantic" not in text


# --- valid stacks ----------------------------------------------------------------------------------------------

def test_empty_file_gives_stack_md_defaults(tmp_path: Path) -> None:
    s = load(tmp_path, "")
    assert s.torch.version == "2.12.0.dev20260307+cu130" and s.torch.pre is True
    assert s.torch.index_url == "https://download.pytorch.org/whl/nightly/cu130"
    assert s.flashinfer.version == "0.6.5" and s.flashinfer.jit_cache_version == "0.6.5+cu130"
    assert s.flashinfer.python.index_url == s.flashinfer.cubin.index_url == "https://pypi.org/simple"
    assert s.flashinfer.jit_cache.index_url == "https://flashinfer.ai/whl/cu130"
    assert s.sglang.branch == "main" and s.sglang.commit == "latest"
    assert s.sgl_kernel.arch == "12.0a" and s.sgl_kernel.max_jobs == "auto" and s.sgl_kernel.compile_threads == 1
    assert s.model.name == "nvidia/Qwen3.5-397B-A17B-NVFP4" and s.model.served_name is None
    assert s.server.tp == 8 and s.server.port == 30000 and s.server.mem_fraction_static == 0.85
    assert s.server.attention_backend == "triton" and s.server.fp4_gemm_backend == "flashinfer_cudnn"
    assert s.server.speculative.algorithm == "NEXTN" and s.server.speculative.num_draft_tokens == 4
    assert s.server.env == {"SGLANG_ENABLE_SPEC_V2": "True", "SGLANG_ENABLE_JIT_DEEPGEMM": "0"}
    assert s.server.health_timeout == 1800 and s.pip.trusted_hosts == []


def test_patch_dirs_resolve_against_stack_file(tmp_path: Path) -> None:
    s = load(tmp_path, '[sglang]\npatches = "p/sg"\n')
    assert s.sglang.patches == tmp_path.resolve() / "p" / "sg"
    assert s.sgl_kernel.patches == tmp_path.resolve() / "patches" / "sgl-kernel"


def test_shipped_stack_loads_and_matches_model_defaults(tmp_path: Path) -> None:
    shipped = load_stack(REPO / "stack.toml")
    defaults = load(tmp_path, "")
    assert shipped.sglang.patches == REPO / "patches" / "sglang"
    drop = {"sglang": {"patches", "commit"}, "sgl_kernel": {"patches"}}
    assert shipped.model_dump(exclude=drop) == defaults.model_dump(exclude=drop)
    # the one deliberate difference: stack.toml pins the upstream commit its patches were checked against
    assert (shipped.sglang.commit, defaults.sglang.commit) == ("5297b02c8", "latest")


def test_url_source_and_pins(tmp_path: Path) -> None:
    s = load(tmp_path, f"""
[sglang]
commit = "ABCDEF1"
[sgl_kernel]
max_jobs = 4
[flashinfer.jit_cache]
url = "https://github.com/x/flashinfer_jit_cache-0.6.5+cu130-cp39-abi3-manylinux_2_28_x86_64.whl"
sha256 = "{SHA.upper()}"
[server.speculative]
algorithm = "none"
""")
    assert s.sglang.commit == "abcdef1" and s.sgl_kernel.max_jobs == 4
    assert s.flashinfer.jit_cache.index_url is None and s.flashinfer.jit_cache.sha256 == SHA
    assert s.server.speculative.algorithm is None


@pytest.mark.parametrize("trusted", ["10.213.0.1", "10.213.0.1:8080"])
def test_plain_http_index_with_trusted_host(tmp_path: Path, trusted: str) -> None:
    s = load(tmp_path, f'[pip]\nextra_index_urls = ["http://10.213.0.1:8080/simple"]\ntrusted_hosts = ["{trusted}"]\n')
    assert s.pip.extra_index_urls == ["http://10.213.0.1:8080/simple"]


# --- errors ----------------------------------------------------------------------------------------------------

def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_stack(tmp_path / "none.toml")
    assert_names(info.value, "none.toml", "does not exist")


def test_toml_syntax_error(tmp_path: Path) -> None:
    assert_names(error(tmp_path, "[torch]\nversion = 2.x\n"), "stack.toml", "invalid TOML", "line 2")


@pytest.mark.parametrize("text, field, got", [
    ("[torh]\nversion = '1'\n", "torh", "{'version': '1'}"),
    ("[torch]\nverison = '1'\n", "torch.verison", "'1'"),
    ("[flashinfer.jit_cache]\nlocal = 'cu130'\n", "flashinfer.jit_cache.local", "'cu130'"),
    ("[server.speculative]\nsteps = 3\n", "server.speculative.steps", "3"),
])
def test_unknown_keys_name_dotted_field(tmp_path: Path, text: str, field: str, got: str) -> None:
    err = error(tmp_path, text)
    assert_names(err, "stack.toml", f"field {field!r}", "unknown key", "allowed keys", f"(got {got})")


def test_unknown_key_lists_allowed(tmp_path: Path) -> None:
    err = error(tmp_path, "[server.speculative]\nsteps = 3\n")
    assert_names(err, "algorithm, num_steps, eagle_topk, num_draft_tokens, draft_model_path")


@pytest.mark.parametrize("text, field, got", [
    ('[torch]\nversion = "2.12-nightly!"\n', "torch.version", "'2.12-nightly!'"),
    ('[flashinfer]\nversion = "latest"\n', "flashinfer.version", "'latest'"),
])
def test_bad_version(tmp_path: Path, text: str, field: str, got: str) -> None:
    assert_names(error(tmp_path, text), "stack.toml", f"field {field!r}", "valid version", f"(got {got})")


@pytest.mark.parametrize("text, field, words, got", [
    ("[torch]\npre = 'yes'\n", "torch.pre", "boolean", "'yes'"),
    ("[server]\ntp = '8'\n", "server.tp", "integer", "'8'"),
    ("[server]\nmem_fraction_static = 1.2\n", "server.mem_fraction_static", "less than 1", "1.2"),
    ("[server]\nmem_fraction_static = 0\n", "server.mem_fraction_static", "greater than 0", "0"),
    ("[server]\nport = 0\n", "server.port", "greater than", "0"),
    ("[server]\nextra_args = ['--x', 3]\n", "server.extra_args[1]", "string", "3"),
    ("[server.env]\nSGLANG_X = 0\n", "server.env.SGLANG_X", "string", "0"),
    ("[server.env]\n'BAD-NAME' = '1'\n", "server.env.BAD-NAME", "environment variable", "'BAD-NAME'"),
    ("[server]\nattention_backend = 'tri ton'\n", "server.attention_backend", "single word", "'tri ton'"),
    ("[server.speculative]\nalgorithm = 'MEDUSA'\n", "server.speculative.algorithm", "NEXTN", "'MEDUSA'"),
    ("[sgl_kernel]\nmax_jobs = 0\n", "sgl_kernel.max_jobs", '"auto" or a positive integer', "0"),
    ("[sgl_kernel]\nmax_jobs = 'many'\n", "sgl_kernel.max_jobs", '"auto" or a positive integer', "'many'"),
    ("[sgl_kernel]\ncuda_home = 'cuda'\n", "sgl_kernel.cuda_home", "absolute", "'cuda'"),
    ("[sgl_kernel]\narch = 'sm_120'\n", "sgl_kernel.arch", "12.0a", "'sm_120'"),
    ("[sglang]\ncommit = 'abc'\n", "sglang.commit", "7 to 40 hex", "'abc'"),
    ("[sglang]\ncommit = 'HEAD'\n", "sglang.commit", '"latest"', "'HEAD'"),
    ("[sglang]\nbranch = '-x'\n", "sglang.branch", "branch name", "'-x'"),
    ("[torch]\nindex_url = 'download.pytorch.org'\n", "torch.index_url", "URL", "'download.pytorch.org'"),
    ("[pip]\nextra_index_urls = ['ftp://x/simple']\n", "pip.extra_index_urls[0]", "URL", "'ftp://x/simple'"),
    ("[pip]\ntrusted_hosts = ['a b']\n", "pip.trusted_hosts[0]", "single word", "'a b'"),
    ("[server]\nsmoke_expect = ' '\n", "server.smoke_expect", "empty", "' '"),
])
def test_bad_values(tmp_path: Path, text: str, field: str, words: str, got: str) -> None:
    err = error(tmp_path, text)
    assert_names(err, "stack.toml", f"field {field!r}", words, f"(got {got})")
    assert err.field == field


def test_both_index_url_and_url(tmp_path: Path) -> None:
    err = error(tmp_path, f'[flashinfer.cubin]\nindex_url = "https://pypi.org/simple"\nurl = "https://x/c.whl"\n'
                          f'sha256 = "{SHA}"\n')
    assert_names(err, "stack.toml", "field 'flashinfer.cubin.url'", "either index_url or url",
                 "(got 'https://x/c.whl')")


def test_url_requires_sha256(tmp_path: Path) -> None:
    err = error(tmp_path, '[flashinfer.jit_cache]\nurl = "https://x/j.whl"\n')
    assert_names(err, "stack.toml", "field 'flashinfer.jit_cache.sha256'", "required when url")


def test_sha256_must_be_64_hex(tmp_path: Path) -> None:
    err = error(tmp_path, '[flashinfer.jit_cache]\nurl = "https://x/j.whl"\nsha256 = "abc"\n')
    assert_names(err, "field 'flashinfer.jit_cache.sha256'", "64 hex", "(got 'abc')")


def test_sha256_without_url(tmp_path: Path) -> None:
    err = error(tmp_path, f'[flashinfer.python]\nsha256 = "{SHA}"\n')
    assert_names(err, "field 'flashinfer.python.sha256'", "url source")


def test_eagle3_needs_draft_model(tmp_path: Path) -> None:
    err = error(tmp_path, '[server.speculative]\nalgorithm = "EAGLE3"\n')
    assert_names(err, "stack.toml", "field 'server.speculative.draft_model_path'", "EAGLE3")


def test_plain_http_index_needs_trusted_host(tmp_path: Path) -> None:
    err = error(tmp_path, '[torch]\nindex_url = "http://10.213.0.1:8080/whl"\n')
    assert_names(err, "stack.toml", "field 'torch.index_url'", "pip.trusted_hosts", "'10.213.0.1'",
                 "(got 'http://10.213.0.1:8080/whl')")


def test_section_must_be_table(tmp_path: Path) -> None:
    assert_names(error(tmp_path, 'server = "fast"\n'), "stack.toml", "field 'server'", "(got 'fast')")


# --- per-host overrides ----------------------------------------------------------------------------------------

@pytest.fixture
def base(tmp_path: Path) -> Stack:
    return load(tmp_path, '[server]\nextra_args = ["--a"]\n[server.env]\nA = "1"\n')


def test_no_overrides_returns_same_stack(base: Stack) -> None:
    assert stack_for_host(base, {}, source="inv.toml", host="gpu1") is base


def test_override_deep_merges(base: Stack) -> None:
    s = stack_for_host(base, {"server": {"mem_fraction_static": 0.8, "env": {"B": "2"}, "extra_args": ["--b"]}},
                       source="inv.toml", host="gpu1")
    assert s.server.mem_fraction_static == 0.8 and s.server.tp == 8
    assert s.server.env == {"A": "1", "B": "2"}
    assert s.server.extra_args == ["--b"]
    assert base.server.mem_fraction_static == 0.85 and base.server.env == {"A": "1"}


def test_override_keeps_base_patch_paths(base: Stack, tmp_path: Path) -> None:
    s = stack_for_host(base, {"server": {"port": 31000}}, source="/elsewhere/inv.toml", host="gpu1")
    assert s.sglang.patches == tmp_path.resolve() / "patches" / "sglang"


def test_override_relative_patch_path_reads_from_source(base: Stack) -> None:
    s = stack_for_host(base, {"sglang": {"patches": "../p"}}, source="/inv/hosts/x.toml", host="gpu1")
    assert s.sglang.patches == Path("/inv/p")


def test_override_switches_wheel_source(base: Stack) -> None:
    s = stack_for_host(base, {"flashinfer": {"jit_cache": {"url": "https://x/j.whl", "sha256": SHA}}},
                       source="inv.toml", host="gpu1")
    assert s.flashinfer.jit_cache.url == "https://x/j.whl" and s.flashinfer.jit_cache.index_url is None
    back = stack_for_host(s, {"flashinfer": {"jit_cache": {"index_url": "https://pypi.org/simple"}}},
                          source="inv.toml", host="gpu1")
    assert back.flashinfer.jit_cache.url is None and back.flashinfer.jit_cache.sha256 is None


def test_override_disables_speculative(base: Stack) -> None:
    s = stack_for_host(base, {"server": {"speculative": {"algorithm": "none"}}}, source="inv.toml", host="gpu1")
    assert s.server.speculative.algorithm is None


def test_override_unknown_key(base: Stack) -> None:
    err = override_error(base, {"server": {"attn_backend": "triton"}})
    assert_names(err, "/inv/hosts.toml", "host 'gpu2'", "field 'server.attn_backend'", "unknown key",
                 "attention_backend", "(got 'triton')")


def test_override_bad_value(base: Stack) -> None:
    err = override_error(base, {"server": {"mem_fraction_static": 1.5}})
    assert_names(err, "/inv/hosts.toml", "host 'gpu2'", "field 'server.mem_fraction_static'", "(got 1.5)")


def test_override_bad_version(base: Stack) -> None:
    err = override_error(base, {"torch": {"version": "nightly"}})
    assert_names(err, "/inv/hosts.toml", "host 'gpu2'", "field 'torch.version'", "(got 'nightly')")


def test_override_cross_field_recheck(base: Stack) -> None:
    err = override_error(base, {"server": {"speculative": {"algorithm": "EAGLE3"}}})
    assert_names(err, "host 'gpu2'", "field 'server.speculative.draft_model_path'")


def test_override_not_a_table(base: Stack) -> None:
    assert_names(override_error(base, {"server": 3}), "host 'gpu2'", "field 'server'", "(got 3)")


def test_host_stacks_from_inventory(tmp_path: Path, base: Stack) -> None:
    inv_path = write(tmp_path, '[defaults.stack.server]\nport = 31000\n'
                               '[hosts.a]\naddress = "a"\n[hosts.b]\naddress = "b"\n'
                               '[hosts.b.stack.server]\nport = 32000\ntp = 4\n', "inv.toml")
    stacks = host_stacks(base, load_inventory(inv_path))
    assert {n: (s.server.port, s.server.tp) for n, s in stacks.items()} == {"a": (31000, 8), "b": (32000, 4)}


def test_host_stacks_error_names_inventory(tmp_path: Path, base: Stack) -> None:
    inv_path = write(tmp_path, '[hosts.a]\naddress = "a"\n[hosts.a.stack.server]\ntp = "4"\n', "inv.toml")
    with pytest.raises(ConfigError) as info:
        host_stacks(base, load_inventory(inv_path))
    assert_names(info.value, "inv.toml", "host 'a'", "field 'server.tp'", "(got '4')")


def test_shipped_example_inventory_against_shipped_stack() -> None:
    stacks = host_stacks(load_stack(REPO / "stack.toml"), load_inventory(REPO / "hosts" / "example.toml"))
    backends = {n: s.server.attention_backend for n, s in stacks.items()}
    assert backends == {"gpu1": "triton", "gpu2": "triton", "gpu3": "flashinfer"}
