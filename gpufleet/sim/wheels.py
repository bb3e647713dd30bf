"""Real, pip-installable stand-in wheels of the simulated stack (torch, flashinfer, sgl-kernel, ...)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zipfile
from pathlib import Path

PAYLOAD = Path(__file__).parent / "payload" / "wheels"
ARCH_LIST = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
LINUX = '; platform_system == "Linux"'
# Fixed timestamp so the same inputs give byte-identical wheels (and stable index hashes).
ZIP_DATE = (2026, 1, 1, 0, 0, 0)

OLD = {
    "torch": "2.9.1+cu130",
    "triton": "3.5.1",
    "nvidia-cuda-runtime": "13.0.96",
    "nvidia-cublas": "13.1.0.3",
    "flashinfer-python": "0.6.4",
    "flashinfer-cubin": "0.6.4",
    "flashinfer-jit-cache": "0.6.4+cu130",
    "sgl-kernel": "0.3.16",
}
TARGET = {
    "torch": "2.12.0.dev20260307+cu130",
    "triton": "3.6.0",
    "nvidia-cuda-runtime": "13.0.96",
    "nvidia-cublas": "13.2.0.1",
    "flashinfer-python": "0.6.5",
    "flashinfer-cubin": "0.6.5",
    "flashinfer-jit-cache": "0.6.5+cu130",
    # flashinfer-python 0.6.5 needs it by a range (>=), as the real one needs nvidia-cudnn-frontend: the version a
    # host gets moves with the index, which is what a fleet lock pins
    "nvidia-cudnn-frontend": "1.13.0",
}
STACKS = {"old": OLD, "target": TARGET}
SGL_KERNEL_OLD_ARCHS = ["sm_90a", "sm_100a", "sm_120a"]


def normalize(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_name(name: str) -> str:
    """The name as wheel file names and .dist-info directories spell it."""
    return normalize(name).replace("-", "_")


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def metadata(name: str, version: str, requires: list[str]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             f"Summary: gpufleet simulated stand-in for {name}"]
    return "\n".join(lines + [f"Requires-Dist: {req}" for req in requires]) + "\n"


def wheel_text() -> str:
    return "Wheel-Version: 1.0\nGenerator: gpufleet-sim\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def entry_points_text(scripts: dict[str, str]) -> str:
    return "[console_scripts]\n" + "".join(f"{name} = {target}\n" for name, target in sorted(scripts.items()))


def write_member(archive: zipfile.ZipFile, path: str, data: bytes) -> None:
    info = zipfile.ZipInfo(path, ZIP_DATE)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def build_wheel(outdir: Path, name: str, version: str, files: dict[str, str], requires: list[str] = [],
                scripts: dict[str, str] | None = None) -> Path:
    """Write a py3-none-any wheel holding `files` (archive path -> text); `scripts` adds console scripts."""
    info_dir = f"{dist_name(name)}-{version}.dist-info"
    members = {path: text.encode() for path, text in sorted(files.items())}
    members[f"{info_dir}/METADATA"] = metadata(name, version, list(requires)).encode()
    members[f"{info_dir}/WHEEL"] = wheel_text().encode()
    if scripts:
        members[f"{info_dir}/entry_points.txt"] = entry_points_text(scripts).encode()
    record = "".join(f"{path},{record_hash(data)},{len(data)}\n" for path, data in members.items())
    members[f"{info_dir}/RECORD"] = (record + f"{info_dir}/RECORD,,\n").encode()
    Path(outdir).mkdir(parents=True, exist_ok=True)
    target = Path(outdir) / f"{dist_name(name)}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w") as archive:
        for path, data in members.items():
            write_member(archive, path, data)
    return target


def package_files(package: str, subs: dict[str, str]) -> dict[str, str]:
    """A stand-in package's sources from the payload, with @KEY@ placeholders filled in."""
    files = {}
    for source in sorted((PAYLOAD / package).rglob("*.py")):
        text = source.read_text()
        for key, value in subs.items():
            text = text.replace(f"@{key}@", value)
        files[source.relative_to(PAYLOAD).as_posix()] = text
    return files


def git_version(name: str, version: str) -> str:
    return hashlib.sha1(f"{name}=={version}".encode()).hexdigest()


def torch_wheel(outdir: Path, stack: dict[str, str]) -> Path:
    version = stack["torch"]
    subs = {"VERSION": version, "CUDA": "13.0", "GIT_VERSION": git_version("torch", version),
            "ARCH_LIST": ",".join(ARCH_LIST)}
    requires = [f"{dep}=={stack[dep]}{LINUX}" for dep in ("nvidia-cuda-runtime", "nvidia-cublas", "triton")]
    return build_wheel(outdir, "torch", version, package_files("torch", subs), requires)


def nvidia_wheel(outdir: Path, name: str, version: str, library: str) -> Path:
    # Real cu13 wheels put their libraries under nvidia/cu13/lib; a text stub stands in for the .so.
    files = {f"nvidia/cu13/lib/{library}": f"gpufleet-sim stand-in for {library} from {name} {version}\n"}
    return build_wheel(outdir, name, version, files)


def flashinfer_wheels(outdir: Path, stack: dict[str, str]) -> list[Path]:
    version = stack["flashinfer-python"]
    core = package_files("flashinfer", {"VERSION": version, "GIT_VERSION": git_version("flashinfer", version)})
    return [
        build_wheel(outdir, "flashinfer-python", version, core,
                    ["torch", *([f"nvidia-cudnn-frontend>={stack['nvidia-cudnn-frontend']}"]
                                if "nvidia-cudnn-frontend" in stack else [])],
                    {"flashinfer": "flashinfer.__main__:main"}),
        build_wheel(outdir, "flashinfer-cubin", stack["flashinfer-cubin"],
                    package_files("flashinfer_cubin", {"VERSION": stack["flashinfer-cubin"]})),
        build_wheel(outdir, "flashinfer-jit-cache", stack["flashinfer-jit-cache"],
                    package_files("flashinfer_jit_cache", {"VERSION": stack["flashinfer-jit-cache"]})),
    ]


def sgl_kernel_build_info(version: str, torch_version: str) -> dict:
    return {"version": version, "source": "prebuilt", "torch": torch_version, "cuda": "13.0", "cxx11_abi": True,
            "archs": SGL_KERNEL_OLD_ARCHS, "fp4": True, "fa3": True}


def sgl_kernel_wheel(outdir: Path, version: str, torch_version: str) -> Path:
    info = json.dumps(sgl_kernel_build_info(version, torch_version))
    files = package_files("sgl_kernel", {"VERSION": version, "BUILD_INFO": info})
    return build_wheel(outdir, "sgl-kernel", version, files)


def stack_wheels(outdir: Path, stack: dict[str, str]) -> list[Path]:
    wheels = [
        torch_wheel(outdir, stack),
        build_wheel(outdir, "triton", stack["triton"], package_files("triton", {"VERSION": stack["triton"]})),
        nvidia_wheel(outdir, "nvidia-cuda-runtime", stack["nvidia-cuda-runtime"], "libcudart.so.13"),
        nvidia_wheel(outdir, "nvidia-cublas", stack["nvidia-cublas"], "libcublas.so.13"),
        *flashinfer_wheels(outdir, stack),
    ]
    if "nvidia-cudnn-frontend" in stack:
        wheels.append(nvidia_wheel(outdir, "nvidia-cudnn-frontend", stack["nvidia-cudnn-frontend"],
                                   "libcudnn_frontend.so"))
    if "sgl-kernel" in stack:
        wheels.append(sgl_kernel_wheel(outdir, stack["sgl-kernel"], stack["torch"]))
    return wheels


def build_stack_wheels(outdir: Path) -> list[Path]:
    """Build the OLD and the TARGET stacks into outdir; a wheel both stacks share is listed once."""
    built: list[Path] = []
    for stack in (OLD, TARGET):
        built += [wheel for wheel in stack_wheels(Path(outdir), stack) if wheel not in built]
    return built
