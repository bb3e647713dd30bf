# What torch in a venv sees: version, CUDA, devices, arch list, C++ ABI, as one JSON line.
# Run with the venv's python; no arguments. Leaves its report in `r` (roles/torch.py appends a comparison).
import json
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": "import torch failed: %s: %s" % (type(exc).__name__, exc)}))
    raise SystemExit(1)
r = {"version": torch.__version__, "cuda": torch.version.cuda, "git": getattr(torch.version, "git_version", None)}
try:
    r["avail"], r["count"] = bool(torch.cuda.is_available()), int(torch.cuda.device_count())
except Exception as exc:
    r["avail"], r["count"], r["cuda_error"] = False, 0, "%s: %s" % (type(exc).__name__, exc)
r["cap"], r["name"] = None, None
if r["avail"] and r["count"]:
    r["cap"], r["name"] = list(torch.cuda.get_device_capability(0)), torch.cuda.get_device_name(0)
try:
    # get_arch_list() is empty without a GPU; the build's arch flags are not
    flags = torch._C._cuda_getArchFlags() if hasattr(torch._C, "_cuda_getArchFlags") else None
    r["arch_list"] = flags.split() if flags else torch.cuda.get_arch_list()
except Exception:
    r["arch_list"] = []
abi = getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None)
r["cxx11abi"] = None if abi is None else bool(abi)
print(json.dumps(r))
