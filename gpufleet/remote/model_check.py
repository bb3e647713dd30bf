# Check a model directory: config.json, every shard the index names, each shard's size.
# Args: argv[1] model dir, argv[2] mode. report: print the JSON report, exit 0. verify: exit 0 only when complete.
# needed: exit 0 while incomplete (a download is still needed), 1 once complete.
# A shard's expected size comes from its own safetensors header: 8 + header length + the end of the last tensor.
# Prints one line `@@gpufleet-model {json}`.
import json, os, struct, sys
d, mode = sys.argv[1], sys.argv[2]
r = {"dir": d, "exists": os.path.isdir(d), "config": False, "index": False, "shards": 0, "bytes": 0,
     "missing": [], "empty": [], "bad": [], "error": None}
def expected_size(path, size):
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return None
        n = struct.unpack("<Q", head)[0]
        if n > min(size - 8, 100 * 2 ** 20):
            return None
        header = json.loads(f.read(n))
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    return 8 + n + max(ends, default=0)
names = []
if r["exists"]:
    r["config"] = os.path.isfile(os.path.join(d, "config.json"))
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.isfile(index):
        r["index"] = True
        try:
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except Exception as e:
            r["error"] = "unreadable model.safetensors.index.json (%s: %s)" % (type(e).__name__, e)
    elif os.path.isfile(os.path.join(d, "model.safetensors")):
        names = ["model.safetensors"]
    else:
        r["error"] = "neither model.safetensors.index.json nor model.safetensors is there"
for name in names:
    path = os.path.join(d, name)
    try:
        size = os.stat(path).st_size
    except OSError:
        r["missing"].append(name)
        continue
    if size == 0:
        r["empty"].append(name)
        continue
    r["shards"] += 1
    r["bytes"] += size
    try:
        want = expected_size(path, size)
    except Exception:
        want = None
    if want is None:
        r["bad"].append([name, "unreadable safetensors header"])
    elif want != size:
        r["bad"].append([name, "%d bytes, its header says %d" % (size, want)])
ok = r["exists"] and r["config"] and not r["error"] and not (r["missing"] or r["empty"] or r["bad"])
print("@@gpufleet-model " + json.dumps(r, sort_keys=True))
if mode == "verify":
    sys.exit(0 if ok else 1)
if mode == "needed":
    sys.exit(1 if ok else 0)
