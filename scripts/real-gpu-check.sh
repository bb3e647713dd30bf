#!/bin/bash
# real-gpu-check.sh: prove gpufleet's read and verify paths on a real GPU server, over real SSH, offline.
#
# Run as root ON the GPU server, from the repository root, with these carried next to it (docs/REAL_HARDWARE.md):
#   .whl/          wheels of gpufleet's Python dependencies for the server's Python (cp312 on Ubuntu 24.04)
#   .debs/noble/   openssh-server, openssh-client, openssh-sftp-server, libwrap0 (Ubuntu 24.04), used only
#                  when the server has no sshd / ssh-keygen of its own
# It starts a private OpenSSH sshd on 127.0.0.1:$GF_PORT (own config, keys and authorized_keys; nothing in
# /etc/ssh or ~/.ssh is touched), writes an inventory naming this machine as host `h200`, then runs gpufleet's own
# commands against it over SSH: inv facts --json, inv facts, inv status --json, inv status, and gather_facts plus
# the torch probe through one HostSession. If that plain SSH session cannot see the GPU (nvidia-smi or libcuda
# outside the login PATH / library path), a second pass repeats step 5 with the command's PATH and
# LD_LIBRARY_PATH passed by sshd's SetEnv, into capture/setenv/.
# Everything lands in $OUT (default $GF_WORK/out): run.log and capture.tar.gz (private keys excluded).
# Nothing is fetched from the network. Parameters (environment; defaults in brackets):
#   GF_WORK [/root/gpufleet-check]  GF_PORT [2222]  GF_HOST [h200]  GF_VENV [/opt/torch/.venv]
#   GF_CHECKOUT [/root/sglang-main]  GF_SERVICE [sglang]  GF_MODEL_PATH [/models/none]
#   GF_GPU_COUNT [1]  GF_GPU_CC [9.0]  GF_GPU_NAME [NVIDIA H200] (set empty: no name check)
#   GF_PY [python3.12, else /usr/bin/python3]: the Python that runs gpufleet (must match the wheels' cp tag)
#   GF_PIP_PY [$GF_VENV/bin/python]: a Python with pip, used only to install the wheels
#   GF_WHEELS [.whl]  GF_DEBS [.debs/noble]  GF_STACK [stack.toml]
#   GF_SSHD [system sshd if any, else the carried one]  GF_KEEP_SSHD [0]: 1 leaves sshd running
#   GF_SETENV_PASS [auto]: always | never | auto (only when the plain pass saw no GPU)
set -u
REPO=$(pwd -P)
W=${GF_WORK:-/root/gpufleet-check}
PORT=${GF_PORT:-2222}
HOST=${GF_HOST:-h200}
VENV=${GF_VENV:-/opt/torch/.venv}
CHECKOUT=${GF_CHECKOUT:-/root/sglang-main}
SERVICE=${GF_SERVICE:-sglang}
MODEL_PATH=${GF_MODEL_PATH:-/models/none}
GPU_COUNT=${GF_GPU_COUNT:-1}
GPU_CC=${GF_GPU_CC:-9.0}
GPU_NAME=${GF_GPU_NAME-NVIDIA H200}
WHEELS=${GF_WHEELS:-$REPO/.whl}
DEBS=${GF_DEBS:-$REPO/.debs/noble}
STACK=${GF_STACK:-$REPO/stack.toml}
OUT=${OUT:-$W/out}
C=$W/capture   # everything in here goes into capture.tar.gz
D=$C           # where `timed` writes
INV=$W/h200.toml
export PYTHONUNBUFFERED=1 PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SSHD_PID=

T0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
log() { printf '[%6ss] %s\n' "$(since "$T0")" "$*"; }
die() { log "FATAL: $*"; finish; exit 1; }

# timed NAME CMD...: run CMD (3 min at most), stdout to $D/NAME, stderr to $D/NAME.stderr; rc and seconds to timings
timed() {
    local name=$1 s d rc rel=${D#"$C"}
    shift
    rel=${rel#/}
    s=$(date +%s.%N)
    timeout -k 5 180 "$@" >"$D/$name" 2>"$D/$name.stderr" </dev/null
    rc=$?
    d=$(since "$s")
    printf '%s\t%s\t%s\n' "${rel:+$rel/}$name" "$rc" "$d" >>"$C/timings.tsv"
    log "${rel:+$rel/}$name: rc=$rc in ${d}s ($(wc -c <"$D/$name") bytes, stderr $(wc -c <"$D/$name.stderr") bytes)"
    return $rc
}

finish() {
    if [ -n "$SSHD_PID" ] && [ "${GF_KEEP_SSHD:-0}" != 1 ]; then kill "$SSHD_PID" 2>/dev/null; sleep 0.5; fi
    cp -f "$W/sshd.log" "$C/sshd.log" 2>/dev/null
    printf 'total\t-\t%s\n' "$(since "$T0")" >>"$C/timings.tsv"
    (cd "$W" && tar -czf "$OUT/capture.tar.gz" capture $(ls sshd_config known_hosts client_key.pub 2>/dev/null))
    log "captured $(tar -tzf "$OUT/capture.tar.gz" | wc -l) entries in $OUT/capture.tar.gz"
}

stop_sshd() { [ -n "$SSHD_PID" ] && kill "$SSHD_PID" 2>/dev/null; sleep 0.5; SSHD_PID=; }

write_sshd_config() {  # $1: StrictModes yes|no; $2...: SetEnv lines' values (optional)
    local strict=$1
    shift
    {
        echo "Port $PORT"
        echo "ListenAddress 127.0.0.1"
        echo "HostKey $W/ssh_host_ed25519_key"
        echo "PidFile $W/sshd.pid"
        echo "AuthorizedKeysFile $W/authorized_keys"
        echo "StrictModes $strict"
        echo "UsePAM no"
        echo "PermitRootLogin prohibit-password"
        echo "PubkeyAuthentication yes"
        echo "PasswordAuthentication no"
        echo "KbdInteractiveAuthentication no"
        echo "UseDNS no"
        echo "PrintMotd no"
        echo "PrintLastLog no"
        echo "LogLevel VERBOSE"
        echo "Subsystem sftp $SFTP"
        for kv in "$@"; do echo "SetEnv \"$kv\""; done
    } >"$W/sshd_config"
}

start_sshd() {  # same arguments as write_sshd_config
    write_sshd_config "$@"
    "$SSHD" -t -f "$W/sshd_config" >"$C/sshd-t.txt" 2>&1 || { cat "$C/sshd-t.txt"; die "sshd -t rejected the config"; }
    echo "---- sshd started $(date -u +%H:%M:%S) with StrictModes $1, SetEnv: ${2:+yes}" >>"$W/sshd.log"
    setsid "$SSHD" -f "$W/sshd_config" -D -e >>"$W/sshd.log" 2>&1 </dev/null &
    SSHD_PID=$!
    for _ in $(seq 50); do
        (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break
        sleep 0.2
    done
    log "sshd pid $SSHD_PID (StrictModes $1${2:+, SetEnv}) listening: $( (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && echo yes || echo NO)"
}

ssh_check() {  # the OpenSSH client's view of a login on our sshd: is it up, which environment does a session get
    "$SSH" -F /dev/null -i "$W/client_key" -p "$PORT" -o BatchMode=yes -o StrictHostKeyChecking=yes \
        -o UserKnownHostsFile="$W/known_hosts" -o IdentitiesOnly=yes -o ConnectTimeout=10 root@127.0.0.1 \
        'echo "ssh ok: $(id -un)@$(hostname)"; env | sort; for b in nvidia-smi nvcc git python3; do echo "which $b: $(command -v $b || echo -)"; done; echo "libcuda in ldconfig: $(ldconfig -p | grep -c "libcuda.so.1 ")"'
}

# gpufleet_pass DIR: inv facts/status (JSON and tables), then gather_facts + the torch probe through one HostSession
gpufleet_pass() {
    D=$1
    mkdir -p "$D"
    local inv=("$PY" -m invoke)
    timed inv-facts.json "${inv[@]}" facts --host "$HOST" --json --inventory "$INV" --stack "$STACK"
    timed inv-facts.txt "${inv[@]}" facts --host "$HOST" --inventory "$INV" --stack "$STACK"
    timed inv-status.json "${inv[@]}" status --json --inventory "$INV" --stack "$STACK"
    timed inv-status.txt "${inv[@]}" status --inventory "$INV" --stack "$STACK"
    COLUMNS=250 timed inv-status-wide.txt "${inv[@]}" status --inventory "$INV" --stack "$STACK"
    cat "$D/inv-facts.txt" "$D/inv-status-wide.txt"
    timed engine.txt "$PY" "$W/engine.py" "$INV" "$HOST" "$STACK" "$D"
    cat "$D/engine.txt" "$D/engine.txt.stderr"
    D=$C
}

main() {
    log "== 1. the machine, as this command sees it"
    {
        echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; uname -a; grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release
        echo "id=$(id)"; echo "PATH=$PATH"; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
        for b in nvidia-smi nvcc sshd ssh ssh-keygen git timeout python3 python3.12; do
            echo "which $b: $(command -v $b || echo -)"
        done
        echo "/usr/local/cuda/bin/nvcc: $(ls -l /usr/local/cuda/bin/nvcc 2>&1)"
        echo "libnvidia-ml in ldconfig: $(ldconfig -p | grep -c 'libnvidia-ml.so.1 ')"
        echo "libcuda in ldconfig: $(ldconfig -p | grep -c 'libcuda.so.1 ')"
        echo "systemd: $(ls -d /run/systemd/system 2>&1)"
        echo "sshd user: $(getent passwd sshd || echo absent)"
        echo "root shadow field starts with: $(getent shadow root | cut -d: -f2 | cut -c1)"
        ls -ld / /root /tmp
        echo "venv python: $(ls -l "$VENV/bin/python" 2>&1)"
        echo "checkout: $(ls -ld "$CHECKOUT" 2>&1)"
        echo "nproc=$(nproc)"; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo
    } >"$C/machine.txt" 2>&1
    cat "$C/machine.txt"

    log "== 2. the controller: a venv with gpufleet's dependencies, from the carried wheels only"
    local py_base=${GF_PY:-$(command -v python3.12 || echo /usr/bin/python3)} pip_py=${GF_PIP_PY:-$VENV/bin/python} site
    if "$py_base" -m venv --without-pip "$W/venv" 2>"$C/venv.stderr"; then
        PY=$W/venv/bin/python
        site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        export PYTHONPATH=$REPO
    else
        log "venv failed ($(head -1 "$C/venv.stderr")): using $py_base with PYTHONPATH"
        PY=$py_base site=$W/site
        export PYTHONPATH=$REPO:$site
    fi
    timed pip-install.txt "$pip_py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$site" "$WHEELS"/*.whl || { cat "$C/pip-install.txt.stderr"; die "installing the wheels failed"; }
    "$PY" -c 'import sys, fabric, paramiko, invoke, pydantic, rich, gpufleet.cli
print("controller python", sys.version.split()[0], "paramiko", paramiko.__version__, "fabric", fabric.__version__,
      "invoke", invoke.__version__, "pydantic", pydantic.VERSION)' | tee "$C/controller.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || die "gpufleet does not import"
    cp "$REPO/scripts/real-gpu-check.sh" "$C/real-gpu-check.sh"

    log "== 3. the GPU commands of the facts script, run directly (taken from gpufleet.facts.script)"
    local fields nvcc
    fields=$("$PY" -c 'from gpufleet.facts.script import GPU_QUERY_FIELDS; print(",".join(GPU_QUERY_FIELDS))')
    echo "nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits" >"$C/nvidia-smi-commands.txt"
    echo "nvidia-smi" >>"$C/nvidia-smi-commands.txt"
    timed nvidia-smi-query.csv nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits
    timed nvidia-smi.txt nvidia-smi
    timed nvidia-smi-L.txt nvidia-smi -L
    nvcc=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || echo nvcc)
    timed nvcc-version.txt "$nvcc" --version
    cat "$C/nvidia-smi-query.csv" "$C/nvcc-version.txt"

    log "== 4. a private OpenSSH sshd on 127.0.0.1:$PORT"
    SSHD=${GF_SSHD:-$(command -v sshd || { [ -x /usr/sbin/sshd ] && echo /usr/sbin/sshd; })}
    local keygen ssh_
    keygen=$(command -v ssh-keygen)
    SSH=$(command -v ssh)
    if [ -z "$SSHD" ] || [ -z "$keygen" ] || [ -z "$SSH" ]; then
        log "no system sshd/ssh/ssh-keygen: unpacking the carried .debs from $DEBS"
        mkdir -p "$W/root" "$W/libroot" "$W/lib"
        for f in "$DEBS"/openssh-*.deb; do dpkg -x "$f" "$W/root" || die "dpkg -x $f"; done
        for f in "$DEBS"/*.deb; do case $f in */openssh-*) ;; *) dpkg -x "$f" "$W/libroot" ;; esac; done
        [ -n "$SSHD" ] || SSHD=$W/root/usr/sbin/sshd
        [ -n "$keygen" ] || keygen=$W/root/usr/bin/ssh-keygen
        [ -n "$SSH" ] || SSH=$W/root/usr/bin/ssh
        # only the libraries this system lacks come from the carried packages
        for bin in "$SSHD" "$keygen" "$SSH"; do
            for so in $(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}'); do
                lib=$(find "$W/libroot" -name "$so" | head -1)
                if [ -n "$lib" ]; then cp -L "$lib" "$W/lib/"; log "carried library $so for $(basename "$bin")"
                else log "MISSING library $so for $bin (not carried)"; fi
            done
        done
        export LD_LIBRARY_PATH=$W/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    SFTP=$(dirname "$(dirname "$SSHD")")/lib/openssh/sftp-server
    { echo "sshd=$SSHD"; echo "ssh-keygen=$keygen"; echo "ssh=$SSH"; echo "sftp-server=$SFTP"
      for b in "$SSHD" "$keygen" "$SSH"; do echo "== ldd $b"; ldd "$b"; done; "$SSH" -V; } >"$C/openssh.txt" 2>&1
    grep -E 'not found|^OpenSSH|^sshd=' "$C/openssh.txt"
    getent passwd sshd >/dev/null || {
        useradd --system --no-create-home --home-dir /run/sshd --shell /usr/sbin/nologin sshd \
            || echo 'sshd:x:74:65534:privsep:/run/sshd:/usr/sbin/nologin' >>/etc/passwd
        log "created the privilege separation user sshd"; }
    mkdir -p -m 755 /run/sshd
    if [ "$(getent shadow root | cut -d: -f2 | cut -c1)" = "!" ]; then
        usermod -p '*' root && log "root's password field was locked ('!'): set to '*' (no password; key login allowed)"
    fi
    "$keygen" -q -t ed25519 -N '' -C "gpufleet-check host" -f "$W/ssh_host_ed25519_key" || die "host key"
    "$keygen" -q -t ed25519 -N '' -C "gpufleet-check client" -f "$W/client_key" || die "client key"
    cp "$W/client_key.pub" "$W/authorized_keys"
    chmod 600 "$W/authorized_keys" "$W/client_key" "$W/ssh_host_ed25519_key"
    # the known_hosts entry paramiko looks up for a port other than 22 is [host]:port
    echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$W/ssh_host_ed25519_key.pub")" >"$W/known_hosts"
    local strict=yes
    start_sshd $strict
    if ! ssh_check >"$C/ssh-session.txt" 2>&1; then
        log "ssh with StrictModes yes failed: $(tail -1 "$C/ssh-session.txt"); retrying with StrictModes no"
        stop_sshd
        strict=no
        start_sshd $strict
        ssh_check >"$C/ssh-session.txt" 2>&1 || log "the OpenSSH client check failed again: $(tail -1 "$C/ssh-session.txt")"
    fi
    grep -E '^(ssh ok|PATH=|LD_LIBRARY_PATH=|which|libcuda)' "$C/ssh-session.txt"

    log "== 5. gpufleet's own commands over SSH"
    {
        echo '[settings]'
        echo 'parallelism = 1'
        echo 'connect_timeout = 10'
        echo "known_hosts = \"$W/known_hosts\""
        echo 'accept_new_host_keys = false'
        echo
        echo "[hosts.$HOST]"
        echo 'address = "127.0.0.1"'
        echo "port = $PORT"
        echo 'user = "root"'
        echo "identity_file = \"$W/client_key\""
        echo "venv = \"$VENV\""
        echo "sglang_checkout = \"$CHECKOUT\""
        echo "service = \"$SERVICE\""
        echo "model_path = \"$MODEL_PATH\""
        echo "gpus = { count = $GPU_COUNT, compute_capability = \"$GPU_CC\"${GPU_NAME:+, name = \"$GPU_NAME\"} }"
    } >"$INV"
    cp "$INV" "$C/h200.toml"
    write_engine_py
    gpufleet_pass "$C"

    local mode=${GF_SETENV_PASS:-auto}
    if [ "$mode" = always ] || { [ "$mode" = auto ] && [ -f "$C/no-gpu-over-ssh" ]; }; then
        log "== 5b. again, with this command's PATH and LD_LIBRARY_PATH given to SSH sessions by sshd's SetEnv"
        stop_sshd
        start_sshd $strict "PATH=$PATH" ${LD_LIBRARY_PATH:+"LD_LIBRARY_PATH=$LD_LIBRARY_PATH"}
        mkdir -p "$C/setenv"
        ssh_check >"$C/setenv/ssh-session.txt" 2>&1
        grep -E '^(PATH=|LD_LIBRARY_PATH=|which nvidia|libcuda)' "$C/setenv/ssh-session.txt"
        gpufleet_pass "$C/setenv"
    fi

    log "== 6. wrap up"
    finish
    log "done"
}

write_engine_py() {
    cat >"$W/engine.py" <<'EOF'
"""gather_facts and the torch probe through one gpufleet HostSession; raw outputs and parsed results to a folder."""
import json
import sys
import time
from pathlib import Path

from gpufleet.command import Cmd
from gpufleet.facts import TORCH_PROBE, facts_script, parse_facts, parse_torch_report
from gpufleet.gather import fact_paths, gather_facts
from gpufleet.inventory import load_inventory
from gpufleet.runner import session_for
from gpufleet.stack import host_stacks, load_stack
from gpufleet.status import compare

inv_path, name, stack_path, out = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
inv = load_inventory(inv_path)
host = inv.hosts[name]
stacks = host_stacks(load_stack(stack_path), inv, [host])
(out / "facts-script.sh").write_text(facts_script(host.venv, host.sglang_checkout, host.service, fact_paths(host)))
summary = {}
t = time.monotonic()
with session_for(host, inv) as session:
    summary["connect_s"] = round(time.monotonic() - t, 3)
    facts = gather_facts(session)
    raw = session.results[-1]
    (out / "facts-raw.txt").write_text(raw.output)
    summary["facts"] = {"exit_code": raw.exit_code, "seconds": round(raw.seconds, 3), "bytes": len(raw.output)}
    probe = session.run(Cmd.of(f"{host.venv}/bin/python", "-c", TORCH_PROBE), step="torch-verify", check=False)
    (out / "torch-probe.txt").write_text(probe.output)
    summary["torch_probe"] = {"exit_code": probe.exit_code, "seconds": round(probe.seconds, 3)}
    report = None
    try:
        report = parse_torch_report(probe.output, host.name)
        summary["torch_report"] = report.model_dump(mode="json")
    except Exception as exc:
        summary["torch_report_error"] = f"{type(exc).__name__}: {exc}"
summary["reparsed_raw_equals_engine_facts"] = parse_facts(host.name, raw.output) == facts
summary["problems"] = facts.problems
summary["status"] = compare(host, stacks[host.name], facts).to_json()
summary["total_s"] = round(time.monotonic() - t, 3)
(out / "engine-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
(out / "engine-facts.json").write_text(facts.model_dump_json(indent=2) + "\n")
if facts.gpus is None or report is None or not report.available:
    (out / "no-gpu-over-ssh").write_text("the GPU facts or torch.cuda were not readable over SSH\n")
print(json.dumps({k: v for k, v in summary.items() if k != "status"}, indent=2))
EOF
}

rm -rf "$W" && mkdir -p -m 700 "$W" && mkdir -p "$C" "$OUT" || exit 1
main 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
