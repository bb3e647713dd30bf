"""Install a built sgl-kernel wheel and record what it really is: the architectures in its libraries, its FP4 ops,
torch and CUDA. Runs on the host with the venv's python; never imports gpufleet.

    python -c "$(cat kernel_record.py)" WHEEL ORIGIN INPUTS_JSON KEY RECORD_PATHS_JSON OPS_JSON FP4 ARCHS_SOURCE

ARCHS_SOURCE is the text of kernel_archs.py (shipped along, executed here as a module). Prints one line
`recorded <archs> fp4 <where>`; exits 1 with a sentence when the wheel lacks what the stack needs.
"""

import importlib
import importlib.util
import json
import os
import sys
import time


def kernel_module_dir(names=("sgl_kernel",)):
    """The installed kernel package's directory, found without importing it (import needs a GPU driver)."""
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            return name, list(spec.submodule_search_locations)[0]
    return None, None


def fp4_ops(ops):
    """Where the FP4 ops are: sgl_kernel (up to mid-2026) or sglang.jit_kernel.nvfp4 (layouts that moved them)."""
    found, errors = {}, []
    for where in ("sgl_kernel", "sglang.jit_kernel.nvfp4"):
        try:
            module = importlib.import_module(where)
        except Exception as exc:  # noqa: BLE001 - any import failure is a finding, not a crash
            errors.append("%s: %s: %s" % (where, type(exc).__name__, str(exc).strip().splitlines()[:1]))
            continue
        namespace = None
        if where == "sgl_kernel":
            try:
                import torch

                namespace = getattr(torch.ops, "sgl_kernel", None)
            except Exception:  # noqa: BLE001
                namespace = None
        for op in ops:
            if op in found:
                continue
            try:
                if hasattr(module, op) or (namespace is not None and hasattr(namespace, op)):
                    found[op] = where
            except Exception:  # noqa: BLE001
                pass
    return found, errors


def main(argv):
    wheel, origin, inputs, key, paths, ops, want_fp4, archs_source = argv[1:9]
    inputs, paths, ops = json.loads(inputs), json.loads(paths), json.loads(ops)
    archs_ns = {"__name__": "kernel_archs"}
    exec(compile(archs_source, "kernel_archs.py", "exec"), archs_ns)
    module, directory = kernel_module_dir()
    if directory is None:
        sys.exit("sgl_kernel is not importable from this venv after installing %s" % wheel)
    cuobjdump = archs_ns["find_cuobjdump"]()
    report = [archs_ns["library_report"](path, cuobjdump) for path in archs_ns["libraries"]([directory])]
    libraries = {os.path.relpath(lib["path"], directory): lib for lib in report}
    archs = sorted({a for lib in report for a in lib["archs"]}, key=archs_ns["arch_key"])
    found, errors = fp4_ops(ops)
    missing = [op for op in ops if op not in found]
    import torch

    record = {"key": key, "inputs": inputs, "wheel": wheel, "origin": origin, "archs": archs,
              "libraries": {name: {"archs": lib["archs"], "ptx": lib["ptx"], "method": lib["method"],
                                   "error": lib["error"]} for name, lib in sorted(libraries.items())},
              "fp4": not missing, "fp4_ops": found, "torch": torch.__version__, "cuda": torch.version.cuda}
    d = os.path.dirname(paths[0])
    started = os.path.join(d, "started")
    record["seconds"] = round(time.time() - float(open(started).read()), 1) if os.path.exists(started) else 0.0
    if want_fp4 == "1" and missing:
        sys.exit("the built sgl-kernel lacks FP4 ops %s (looked in sgl_kernel, torch.ops.sgl_kernel and "
                 "sglang.jit_kernel.nvfp4%s)" % (", ".join(missing), "; " + "; ".join(errors) if errors else ""))
    for path in paths:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as out:
            out.write(json.dumps(record, indent=2, sort_keys=True))
        os.replace(path + ".tmp", path)
    where = sorted(set(found.values())) or ["none"]
    print("recorded %s fp4 %s (torch %s, CUDA %s)" % (",".join(archs) or "no GPU code", "+".join(where),
                                                      record["torch"], record["cuda"]))


if __name__ == "__main__":
    main(sys.argv)
