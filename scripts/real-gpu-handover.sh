#!/bin/bash
# real-gpu-handover.sh: prove the wheel hand-over's host side on a real GPU server, offline.
#
# Run as root ON the GPU server, from the repository root, with `.carry/pip-26.3-py3-none-any.whl` beside it (the pip
# gpufleet runs on hosts; `inv upgrade` fetches it into ~/.cache/gpufleet/tools/). Against the server's real venv
# (real CUDA torch installed), it:
#   1. serves a PEP 658 index on 127.0.0.1 holding small stand-in wheels (flashinfer-python needing `torch` and
#      `nvidia-cudnn-frontend>=1.13.0`, as the real one needs them), with an access log;
#   2. resolves `flashinfer-python==0.6.5 flashinfer-cubin==0.6.5` with the venv's own pip and with gpufleet's pinned
#      pip (`<venv python> pip.whl/pip install --dry-run --report`, constraints from a lock), counting the wheel
#      files each downloaded (the pinned one must download none: metadata only);
#   3. reads the pinned pip's report with gpufleet.wheelset.parse_report (what the control node would fetch and push)
#      and installs exactly those files with `--no-index --find-links` into a throwaway venv that sees the real torch;
#   4. times sha256sum and openssl on a 1 GiB file (the on-host verification of gpufleet.push).
# Everything lands in $OUT (default /tmp/handover-out). Parameters: GF_VENV [/opt/torch/.venv].
set -u
REPO=$(pwd -P)
VENV=${GF_VENV:-/opt/torch/.venv}
PY=$VENV/bin/python
OUT=${OUT:-/tmp/handover-out}
W=$(mktemp -d /tmp/gf-handover.XXXX)
PIPWHL=$REPO/.carry/pip-26.3-py3-none-any.whl
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
echo "== machine"; uname -r; . /etc/os-release; echo "$PRETTY_NAME"; nproc
"$PY" -c 'import sys, torch; print("venv python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())'
"$PY" -m pip --version

echo "== 1. index"
PYTHONPATH=$REPO "$PY" - "$W" <<'EOF'
import sys
from pathlib import Path
from gpufleet.sim import wheels, index
w = Path(sys.argv[1]) / "wheels"
stack = dict(wheels.TARGET)
built = wheels.flashinfer_wheels(w, stack)
built.append(wheels.nvidia_wheel(w, "nvidia-cudnn-frontend", "1.13.0", "libcudnn_frontend.so"))
built.append(wheels.nvidia_wheel(w, "nvidia-cudnn-frontend", "1.14.0", "libcudnn_frontend.so"))
index.build_index(built, Path(sys.argv[1]) / "index")
print("\n".join(sorted(p.name for p in built)))
EOF
"$PY" -m http.server --bind 127.0.0.1 --directory "$W/index" 18765 > "$W/access.log" 2>&1 &
SRV=$!
trap 'kill $SRV 2>/dev/null; rm -rf "$W"' EXIT
for i in $(seq 50); do "$PY" -c 'import socket; socket.create_connection(("127.0.0.1", 18765), 1)' 2>/dev/null && break; sleep 0.1; done
IDX=http://127.0.0.1:18765/simple
REQS="flashinfer-python==0.6.5 flashinfer-cubin==0.6.5"
printf 'nvidia-cudnn-frontend==1.13.0\n' > "$W/lock-constraints.txt"   # a fleet lock's pin; the index has 1.14.0 too

echo "== 2a. the venv's own pip ($("$PY" -m pip --version | cut -d' ' -f2)), dry run"
: > "$W/access.log"
PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --dry-run --quiet --report "$OUT/report-venv-pip.json" \
    --index-url "$IDX" -c "$W/lock-constraints.txt" $REQS; echo "exit $?"
echo "wheel files downloaded by the venv's pip: $(grep -c '\.whl HTTP' "$W/access.log")"
echo "metadata files read: $(grep -c '\.whl\.metadata HTTP' "$W/access.log")"
cp "$W/access.log" "$OUT/access-venv-pip.log"

echo "== 2b. gpufleet's pinned pip 26.3 run by the venv's python, dry run (what roles/pip.py resolve_cmd runs)"
: > "$W/access.log"
PIP_CONFIG_FILE=/dev/null "$PY" "$PIPWHL/pip" install --dry-run --quiet --report "$OUT/report-pinned-pip.json" \
    --index-url "$IDX" -c "$W/lock-constraints.txt" $REQS; echo "exit $?"
echo "wheel files downloaded by the pinned pip: $(grep -c '\.whl HTTP' "$W/access.log")"
echo "metadata files read: $(grep -c '\.whl\.metadata HTTP' "$W/access.log")"
cp "$W/access.log" "$OUT/access-pinned-pip.log"

echo "== 3. the report as gpufleet reads it, then the offline install of exactly those files"
PYTHONPATH=$REPO "$PY" - "$OUT/report-pinned-pip.json" "$W/index/files" "$W/push" <<'EOF' | tee "$W/pins"
import hashlib, shutil, sys
from pathlib import Path
from urllib.parse import unquote, urlsplit
from gpufleet.wheelset import parse_report
refs = parse_report(Path(sys.argv[1]).read_text())
push = Path(sys.argv[3]); push.mkdir()
for r in refs:
    served = Path(sys.argv[2]) / r.filename
    assert hashlib.sha256(served.read_bytes()).hexdigest() == r.sha256, r
    shutil.copy(served, push / r.filename)  # what push_files would put in /var/cache/gpufleet/wheels
    print(f"{r.name}=={r.version}")
EOF
# a throwaway venv that sees the real venv's packages (torch included) as installed, as the real venv would
"$PY" -m venv "$W/venv"
"$PY" -c 'import site; print(site.getsitepackages()[0])' > "$("$W/venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/real-venv.pth"
PIP_CONFIG_FILE=/dev/null "$W/venv/bin/python" "$PIPWHL/pip" install --progress-bar off --no-index \
    --find-links "$W/push" -c "$W/lock-constraints.txt" $(cat "$W/pins"); echo "exit $?"
"$W/venv/bin/python" - <<'EOF'
import importlib.metadata as md
import torch
for n in ("torch", "flashinfer-python", "flashinfer-cubin", "nvidia-cudnn-frontend"):
    print(n, md.version(n))
print("torch still imports from the real venv:", torch.__file__, torch.cuda.is_available())
EOF

echo "== 4. on-host verification cost (gpufleet.push hashes each pushed file on the host)"
head -c 1073741824 /dev/urandom > "$W/big"
TIMEFORMAT="sha256sum 1 GiB: %R s"; time sha256sum "$W/big" > /dev/null
TIMEFORMAT="openssl dgst 1 GiB: %R s"; command -v openssl >/dev/null && time openssl dgst -sha256 -r "$W/big" > /dev/null
command -v ssh >/dev/null && { ssh -V; ssh -Q cipher | tr '\n' ' '; echo; } || echo "no ssh client on this machine"
echo "== done"
