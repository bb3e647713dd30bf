"""sgl-kernel (gpufleet simulated sglang): loads common_ops as upstream's load_utils does and exposes its ops.

Upstream's sgl_kernel/load_utils.py picks the library by GPU: compute capability 9.0 loads sm90/common_ops.*
(fast math), any other GPU (the simulated RTX PRO 6000s are 12.0) and no GPU load sm100/common_ops.*, then the
package directory, then a plain `import common_ops`; when all fail it raises "[sgl_kernel] CRITICAL: Could not load
any common_ops library!". A real library built against another torch release fails to load with an undefined
C++ symbol; the stand-in reads the torch version its build recorded and fails the same way.
"""

import glob
import importlib.util
import logging
import os
from pathlib import Path

import torch

from sgl_kernel.version import __version__

logger = logging.getLogger(__name__)

# The symbol a torch of another minor release no longer exports, as real ABI breaks report it.
_MISSING_SYMBOL = "_ZN3c1013MessageLogger6streamB5cxx11Ev"
_TORCH_RECORD = "_built_with_torch.txt"


def _get_compute_capability():
    """Get the compute capability of the current GPU."""
    if not torch.cuda.is_available():
        return None
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    return properties.major * 10 + properties.minor


def _release(version: str) -> tuple:
    return tuple(version.split("+")[0].split(".")[:2])


def _check_torch_abi(ops_path: Path) -> None:
    """What the dynamic loader would say about a library linked against another torch's libc10."""
    record = Path(__file__).parent / _TORCH_RECORD
    if os.environ.get("SGL_KERNEL_SIM_SKIP_ABI_CHECK") == "1" or not record.is_file():
        return
    built = record.read_text().strip()
    if _release(built) != _release(torch.__version__):
        raise ImportError(f"{ops_path}: undefined symbol: {_MISSING_SYMBOL}")


def _load_from(pattern: str, errors: list):
    files = sorted(glob.glob(pattern), key=lambda f: not f.endswith(".so"))
    if not files:
        return None, files
    ops_path = Path(files[0])
    try:
        _check_torch_abi(ops_path)
        spec = importlib.util.spec_from_file_location("common_ops", str(ops_path))
        if spec is None or spec.loader is None:
            raise ImportError(f"Could not create module spec for {ops_path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, files
    except Exception as e:  # as upstream: every failure is collected and reported together
        errors.append(e)
        return None, files


def _load_architecture_specific_ops():
    """Load the appropriate common_ops library based on GPU architecture."""
    compute_capability = _get_compute_capability()
    sgl_kernel_dir = Path(__file__).parent
    if compute_capability == 90:
        ops_subdir, variant_name = "sm90", "SM90 (Hopper/H100 with fast math optimization)"
    elif compute_capability is not None:
        ops_subdir, variant_name = "sm100", f"SM{compute_capability} (precise math for compatibility)"
    else:
        ops_subdir, variant_name = "sm100", "CPU/No GPU detected (using precise math)"

    errors: list = []
    ops_pattern = str(sgl_kernel_dir / ops_subdir / "common_ops.*")
    module, matching_files = _load_from(ops_pattern, errors)
    if module is not None:
        return module
    alt_pattern = str(sgl_kernel_dir / "common_ops.*")
    module, alt_matching_files = _load_from(alt_pattern, errors)
    if module is not None:
        return module
    try:
        import common_ops

        return common_ops
    except ImportError as e:
        errors.append(e)

    attempt_error_msg = "\n".join(f"- {type(err).__name__}: {err}" for err in errors)
    raise ImportError(f"""
[sgl_kernel] CRITICAL: Could not load any common_ops library!

Attempted locations:
1. Architecture-specific pattern: {ops_pattern} - found files: {matching_files}
2. Fallback pattern: {alt_pattern} - found files: {alt_matching_files}
3. Standard Python import: common_ops - failed

GPU Info:
- Compute capability: {compute_capability}
- Expected variant: {variant_name}

Please ensure sgl_kernel is properly installed with:
pip install --upgrade sgl_kernel

Error details from previous import attempts:
{attempt_error_msg}
""")


common_ops = _load_architecture_specific_ops()


def _make_op(name: str):
    def op(*args, **kwargs):
        return {"op": name, "args": len(args), "kwargs": sorted(kwargs)}

    op.__name__ = name
    return op


for _name in common_ops.registered_ops():
    globals()[_name] = _make_op(_name)
    torch.ops._register("sgl_kernel", _name, globals()[_name])
del _name
