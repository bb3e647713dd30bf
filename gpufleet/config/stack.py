"""The target stack (stack.toml): what every box runs, validated; per-host overrides deep-merged and re-validated."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from packaging.version import InvalidVersion, Version
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from gpufleet.config.series import series_file
from gpufleet.config.util import LocalPath, RemotePath, deep_merge, read_toml, validation_error
from gpufleet.errors import ConfigError

if TYPE_CHECKING:
    from gpufleet.config.inventory import Host, Inventory

PYPI = "https://pypi.org/simple"
TORCH_INDEX = "https://download.pytorch.org/whl/nightly/cu130"
FLASHINFER_CU130 = "https://flashinfer.ai/whl/cu130"
_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)  # 1e400 is inf in TOML
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:+-]*$")


def _version(v: str) -> str:
    try:
        Version(v)
    except InvalidVersion:
        raise ValueError("is not a valid version (PEP 440)") from None
    return v


def _url(v: str, schemes: tuple[str, ...] = ("http", "https", "file")) -> str:
    parts = urlsplit(v)
    if parts.scheme not in schemes or not (parts.netloc or parts.scheme == "file") or any(c.isspace() for c in v):
        raise ValueError(f"must be a URL with scheme {' or '.join(schemes)}")
    return v


def _word(v: str) -> str:
    if not _WORD.match(v):
        raise ValueError("must be a single word (letters, digits, '_', '.', ':', '+', '-')")
    return v


def _env_name(v: str) -> str:
    if not _ENV_NAME.match(v):
        raise ValueError("is not a valid environment variable name")
    return v


EnvName = Annotated[str, AfterValidator(_env_name)]


class Section(BaseModel):
    """A stack.toml table: strict types, unknown keys rejected, immutable."""

    model_config = _STRICT


class TorchStack(Section):
    """PyTorch nightly: exact version and the index it comes from."""

    version: str = "2.12.0.dev20260307+cu130"
    index_url: str = TORCH_INDEX
    pre: bool = True

    _v = field_validator("version")(_version)
    _u = field_validator("index_url")(_url)


class WheelSource(Section):
    """Where one wheel comes from: a package index, or a pinned URL with its sha256 (exactly one)."""

    index_url: str | None = None
    url: str | None = Field(None, validate_default=True)
    sha256: str | None = Field(None, validate_default=True)

    @field_validator("index_url")
    @classmethod
    def _index(cls, v: str | None) -> str | None:
        return None if v is None else _url(v)

    @field_validator("url")
    @classmethod
    def _one_of(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("index_url") is not None:
            raise ValueError("set either index_url or url, not both")
        return None if v is None else _url(v)

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", v):
            raise ValueError("must be 64 hex digits")
        if v is None and info.data.get("url") is not None:
            raise ValueError("is required when url is set (64 hex digits)")
        if v is not None and info.data.get("url") is None:
            raise ValueError("only applies to a url source")
        return None if v is None else v.lower()

    @model_validator(mode="after")
    def _default_index(self) -> "WheelSource":
        if self.url is None and self.index_url is None:
            object.__setattr__(self, "index_url", self.default_index())
        return self

    @classmethod
    def default_index(cls) -> str:
        return PYPI


class JitCacheSource(WheelSource):
    """flashinfer-jit-cache: its own index per CUDA version; the wheel carries a local label (0.6.5+cu130)."""

    local_version: str | None = "cu130"

    @field_validator("local_version")
    @classmethod
    def _local(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9]+([._-][A-Za-z0-9]+)*", v):
            raise ValueError("must be a local version label like cu130")
        return v

    @classmethod
    def default_index(cls) -> str:
        return FLASHINFER_CU130


class FlashinferStack(Section):
    """flashinfer's three packages, one version."""

    version: str = "0.6.5"
    python: WheelSource = WheelSource()
    cubin: WheelSource = WheelSource()
    jit_cache: JitCacheSource = JitCacheSource()

    _v = field_validator("version")(_version)

    @property
    def jit_cache_version(self) -> str:
        """The jit-cache wheel's full version, e.g. 0.6.5+cu130."""
        local = self.jit_cache.local_version
        return f"{self.version}+{local}" if local else self.version


class SglangStack(Section):
    """The sglang source checkout: remote, branch, commit ('latest' or a sha) and the local patch directory."""

    remote: str = "https://github.com/sgl-project/sglang.git"
    branch: str = "main"
    commit: str = "latest"
    patches: LocalPath = Field(Path("patches/sglang"), validate_default=True)

    @field_validator("remote")
    @classmethod
    def _remote(cls, v: str) -> str:
        if not v or v.startswith("-") or any(c.isspace() for c in v):
            raise ValueError("must be a git remote URL")
        return v

    @field_validator("branch")
    @classmethod
    def _branch(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_./-]*", v) or ".." in v or v.endswith((".", "/", ".lock")):
            raise ValueError("must be a git branch name")
        return v

    @field_validator("commit")
    @classmethod
    def _commit(cls, v: str) -> str:
        if v != "latest" and not re.fullmatch(r"[0-9a-fA-F]{7,40}", v):
            raise ValueError('must be "latest" or a commit sha of 7 to 40 hex digits')
        return v.lower()


class SglKernelStack(Section):
    """How sgl-kernel is built from the checkout (FP4 kernels for SM120)."""

    arch: str = "12.0a"
    enable_fp4: bool = True
    max_jobs: Literal["auto"] | int = Field("auto", validate_default=True)
    compile_threads: int = Field(1, ge=1)
    cuda_home: RemotePath = "/usr/local/cuda"
    cccl_include: RemotePath = "/usr/local/cuda/include/cccl"
    patches: LocalPath = Field(Path("patches/sgl-kernel"), validate_default=True)
    extra_cmake_args: list[str] = []
    # -D options upstream's CMakeLists reads; they narrow its hard-coded gencode list (TORCH_CUDA_ARCH_LIST does not)
    # (SGL_KERNEL_FORCE_FA3 exists with the site patch patches/sgl-kernel/0001; upstream forces FA3 on otherwise)
    cmake_defines: dict[str, str] = {"ENABLE_BELOW_SM90": "OFF", "SGL_KERNEL_FORCE_FA3": "OFF"}
    # installed into the venv before the build, from the stack's indexes, with the pyproject's build requirements
    build_tools: list[str] = ["cmake>=3.31", "scikit-build-core>=0.10"]
    # FetchContent repositories are fetched by the control node; a prefix here is replaced (a site's GitHub mirror)
    source_mirrors: dict[str, str] = {}

    @field_validator("cmake_defines")
    @classmethod
    def _defines(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not a CMake variable name")
            if not re.fullmatch(r"[A-Za-z0-9_.+/:=-]*", str(value)):
                raise ValueError(f"{key} = {value!r}: only letters, digits and . _ + / : = - are allowed")
        return v

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: str) -> str:
        if not re.fullmatch(r"\d+\.\d+a?", v):
            raise ValueError('must be a CUDA arch like "12.0a"')
        return v

    @field_validator("max_jobs", mode="before")
    @classmethod
    def _jobs(cls, v: object) -> object:
        if v == "auto" or (type(v) is int and v >= 1):
            return v
        raise ValueError('must be "auto" or a positive integer')


class ModelStack(Section):
    """The model served: its hub name and an optional name clients use."""

    name: str = "nvidia/Qwen3.5-397B-A17B-NVFP4"
    served_name: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?", v):
            raise ValueError("must be a model id like org/name")
        return v


class Speculative(Section):
    """Speculative decoding; algorithm "none" turns it off."""

    algorithm: Literal["NEXTN", "EAGLE3"] | None = "NEXTN"
    num_steps: int = Field(3, ge=1)
    eagle_topk: int = Field(1, ge=1)
    num_draft_tokens: int = Field(4, ge=1)
    draft_model_path: RemotePath | None = Field(None, validate_default=True)

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algo(cls, v: object) -> object:
        if v is None or (isinstance(v, str) and v.lower() == "none"):
            return None
        if isinstance(v, str) and v.upper() in ("NEXTN", "EAGLE3"):
            return v.upper()
        raise ValueError('must be "NEXTN", "EAGLE3" or "none"')

    @field_validator("draft_model_path")
    @classmethod
    def _draft(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None and info.data.get("algorithm") == "EAGLE3":
            raise ValueError("is required when algorithm is EAGLE3")
        return v


class ServerStack(Section):
    """sglang.launch_server flags, its environment and the health/smoke checks."""

    tp: int = Field(8, ge=1)
    host: str = "0.0.0.0"
    port: int = Field(30000, ge=1, le=65535)
    quantization: str = "modelopt_fp4"
    attention_backend: str = "triton"
    moe_runner_backend: str = "flashinfer_cutlass"
    fp4_gemm_backend: str = "flashinfer_cudnn"
    kv_cache_dtype: str = "fp8_e4m3"
    mem_fraction_static: float = Field(0.85, gt=0, lt=1)
    context_length: int | None = Field(None, ge=1)
    disable_custom_all_reduce: bool = True
    speculative: Speculative = Speculative()
    reasoning_parser: str | None = "qwen3"
    tool_call_parser: str | None = "qwen3_coder"
    env: dict[EnvName, str] = {"SGLANG_ENABLE_SPEC_V2": "True", "SGLANG_ENABLE_JIT_DEEPGEMM": "0"}
    extra_args: list[str] = []
    health_timeout: float = Field(1800, gt=0, le=86400)
    smoke_prompt: str = "What is the capital of France? Answer with one word."
    smoke_expect: str = "Paris"

    @field_validator("host", "quantization", "attention_backend", "moe_runner_backend", "fp4_gemm_backend",
                     "kv_cache_dtype", "reasoning_parser", "tool_call_parser")
    @classmethod
    def _words(cls, v: str | None) -> str | None:
        return v if v is None else _word(v)

    @field_validator("smoke_expect")
    @classmethod
    def _expect(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty (the smoke check would always pass)")
        return v


class KnownAnswer(Section):
    """A prompt whose answer is known: correct output contains expect (case-insensitive)."""

    prompt: str
    expect: str

    @field_validator("prompt", "expect")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty (an empty expectation is always found)")
        return v


Word = Annotated[str, AfterValidator(_word)]


def _distinct(values: list) -> list:
    if not values:
        raise ValueError("must list at least one value (the probe multiplies the lists: an empty one means no "
                         "candidate at all)")
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise ValueError(f"lists {seen[0]!r} twice")
    return values


class ProbeStack(Section):
    """`inv probe-backends`: candidate backend sets (the lists' cartesian product) and how each is judged."""

    # Defaults: the community SM120 recipe first, then the alternatives that changed correctness across releases.
    # Each candidate loads the whole model (many minutes for 397B), so the default product is kept to 8.
    attention_backends: list[Word] = Field(["triton", "flashinfer"], validate_default=True)
    moe_runner_backends: list[Word] = Field(["flashinfer_cutlass"], validate_default=True)
    fp4_gemm_backends: list[Word] = Field(["flashinfer_cudnn", "flashinfer_cutlass"], validate_default=True)
    # true: the host's [server.speculative] (stack.toml's when the host turned it off); false: algorithm "none".
    speculative: list[bool] = Field([True, False], validate_default=True)
    prompts: list[KnownAnswer] = Field([
        KnownAnswer(prompt="What is the capital of France? Answer with one word.", expect="Paris"),
        KnownAnswer(prompt="What is 17 + 25? Answer with the number only.", expect="42"),
        KnownAnswer(prompt="Spell the word 'apple' backwards. Answer with the word only.", expect="elppa"),
    ], min_length=1)
    answer_max_tokens: int = Field(64, ge=1)
    throughput_prompt: str = "Write a detailed essay on the history of the printing press."
    throughput_max_tokens: int = Field(512, ge=1)
    health_timeout: float = Field(1800, gt=0, le=86400)  # per candidate: from its start to /health 200

    _d = field_validator("attention_backends", "moe_runner_backends", "fp4_gemm_backends", "speculative")(_distinct)


class SpeedGateStack(Section):
    """A roll's throughput gate: decode speed before a host's server is stopped and after its health gate, measured
    the way the backend probe times a candidate ([probe] throughput_prompt and throughput_max_tokens, ignore_eos),
    with `concurrency` generations at once, the best of `rounds`; the host fails when the new speed is lower by more
    than max_slowdown_percent."""

    enabled: bool = True  # `--no-speed-gate` turns it off for one roll
    max_slowdown_percent: float = Field(10.0, ge=0, lt=100)
    concurrency: int = Field(1, ge=1, le=256)
    rounds: int = Field(3, ge=1, le=20)  # a busy moment only slows a round down: the fastest is the stack's speed


class PipStack(Section):
    """Extra indexes and hosts pip must trust (plain-http indexes need the latter)."""

    index_url: Annotated[str, AfterValidator(_url)] = "https://pypi.org/simple"  # build tools, plain dependencies
    extra_index_urls: list[Annotated[str, AfterValidator(_url)]] = []
    trusted_hosts: list[Annotated[str, AfterValidator(_word)]] = []


class Stack(Section):
    """Everything one box runs; local patch directories are absolute Paths once loaded."""

    torch: TorchStack = TorchStack()
    flashinfer: FlashinferStack = FlashinferStack()
    sglang: SglangStack = SglangStack()
    sgl_kernel: SglKernelStack = SglKernelStack()
    model: ModelStack = ModelStack()
    server: ServerStack = ServerStack()
    pip: PipStack = PipStack()
    probe: ProbeStack = ProbeStack()
    speed_gate: SpeedGateStack = SpeedGateStack()

    @model_validator(mode="before")
    @classmethod
    def _all_sections(cls, data: object) -> object:
        # Absent sections are validated from {} so their relative paths resolve against the file's directory.
        if isinstance(data, dict):
            return {**{name: {} for name in cls.model_fields}, **data}
        return data

    def index_urls(self) -> dict[str, str]:
        """Every package index or wheel URL the stack uses, by dotted field."""
        found = {"torch.index_url": self.torch.index_url}
        for part in ("python", "cubin", "jit_cache"):
            src = getattr(self.flashinfer, part)
            found[f"flashinfer.{part}.{'url' if src.url else 'index_url'}"] = src.url or src.index_url
        found.update({f"pip.extra_index_urls[{i}]": u for i, u in enumerate(self.pip.extra_index_urls)})
        return found


def _validate(data: dict[str, Any], path: str | Path, base_dir: Path, host: str | None) -> Stack:
    try:
        stack = Stack.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise validation_error(exc, path, Stack, host=host) from None
    _check_plain_http(stack, path, host)
    return stack


def _check_patch_dirs(stack: Stack, path: str | Path, host: str | None) -> None:
    # stack.toml's patch directories must exist with their series files; an empty series file is "no patches".
    for fld, directory in (("sglang.patches", stack.sglang.patches), ("sgl_kernel.patches", stack.sgl_kernel.patches)):
        try:
            series_file(directory)
        except ConfigError as exc:
            raise ConfigError(str(path), f"{exc.path}: {exc.problem}", host=host, field=fld, value=exc.value,
                              has_value=exc.value is not None) from None


def _check_plain_http(stack: Stack, path: str | Path, host: str | None) -> None:
    for fld, url in stack.index_urls().items():
        parts = urlsplit(url)
        trusted = set(stack.pip.trusted_hosts)
        if parts.scheme == "http" and not {parts.hostname, parts.netloc} & trusted:
            raise ConfigError(str(path), f"plain-http index; add {parts.hostname!r} to pip.trusted_hosts",
                              host=host, field=fld, value=url, has_value=True)


def load_stack(path: str | Path) -> Stack:
    """Read and validate stack.toml; relative patch paths are resolved against its directory, and each patch
    directory must hold a series file (an empty one: no patches)."""
    p = Path(path)
    stack = _validate(read_toml(p), p, p.parent.resolve(), None)
    _check_patch_dirs(stack, p, None)
    return stack


def stack_for_host(stack: Stack, overrides: dict, *, source: str, host: str) -> Stack:
    """stack with a host's overrides (defaults.stack then hosts.<h>.stack, already merged) applied, re-validated.

    Relative paths in overrides are read relative to `source` (the inventory file); errors name it.
    """
    if not overrides:
        return stack
    if not isinstance(overrides, dict):
        raise ConfigError(source, "must be a table", host=host, field="stack", value=overrides, has_value=True)
    base = _drop_switched_sources(stack.model_dump(), overrides)
    return _validate(deep_merge(base, overrides), source, Path(source).parent.resolve(), host)


def _drop_switched_sources(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    # An override that picks a wheel source kind (index_url or url) replaces the base's other kind.
    fi_over = overrides.get("flashinfer")
    if not isinstance(fi_over, dict):
        return base
    for part in ("python", "cubin", "jit_cache"):
        src = fi_over.get(part)
        if isinstance(src, dict) and "url" in src:
            base["flashinfer"][part]["index_url"] = None
        elif isinstance(src, dict) and "index_url" in src:
            base["flashinfer"][part].update(url=None, sha256=None)
    return base


def host_stacks(stack: Stack, inventory: Inventory, hosts: list[Host] | None = None) -> dict[str, Stack]:
    """The effective stack of each host (default: all inventory hosts), overrides validated."""
    chosen = hosts if hosts is not None else list(inventory.hosts.values())
    return {h.name: stack_for_host(stack, h.stack_overrides, source=str(inventory.path), host=h.name) for h in chosen}

