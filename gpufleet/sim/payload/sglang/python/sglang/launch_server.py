"""Launch the (simulated) SGLang server: a stdlib HTTP server that answers like sglang's, deterministically."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import uuid
import socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FAIL_HEALTH_FILE = "/etc/gpufleet-sim/fail-health"
GARBAGE_FILE = "/etc/gpufleet-sim/garbage-output"
# What each backend set does on this (simulated) GPU: see Behaviour. Absent: every set works, instantly.
BACKENDS_FILE = "/etc/gpufleet-sim/backends.json"
BACKEND_KEYS = ("attention_backend", "moe_runner_backend", "fp4_gemm_backend", "speculative_algorithm")
# Questions the stand-in "knows": a correct backend set answers them right (the probe's known answers).
KNOWN_ANSWERS = {"capital of france": "The capital of France is Paris.", "17 + 25": "17 + 25 = 42.",
                 "'apple' backwards": "elppa"}
logger = logging.getLogger("sglang.launch_server")


class _Server(ThreadingHTTPServer):
    """HTTPServer without its reverse-DNS lookup of the bind address (a host without a resolver waits seconds)."""

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    parser.add_argument("--model-path", "--model", dest="model_path", required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--tp", "--tp-size", "--tensor-parallel-size", dest="tp", type=int, default=1)
    parser.add_argument("--context-length", type=int, default=262144)
    parser.add_argument("--enable-torch-symm-mem", action="store_true")
    parser.add_argument("--attention-backend")
    parser.add_argument("--moe-runner-backend", default="auto")
    parser.add_argument("--fp4-gemm-backend", default="auto")
    parser.add_argument("--speculative-algorithm")
    parser.add_argument("--speculative-num-steps", type=int)
    parser.add_argument("--speculative-eagle-topk", type=int)
    parser.add_argument("--speculative-num-draft-tokens", type=int)
    parser.add_argument("--speculative-draft-model-path")
    # Every other sglang flag is accepted and ignored.
    return parser.parse_known_args(argv)


def failing_health() -> bool:
    return os.environ.get("SGLANG_SIM_FAIL_HEALTH") == "1" or os.path.exists(FAIL_HEALTH_FILE)


def garbage_output() -> bool:
    return os.environ.get("SGLANG_SIM_GARBAGE") == "1" or os.path.exists(GARBAGE_FILE)


DEFAULT_TOKENS_PER_SECOND = 1000


class Behaviour:
    """What this launch's backend set does, from BACKENDS_FILE:

        {"default": {"tokens_per_second": 100, "load_seconds": 1},
         "rules": [{"when": {"attention_backend": "flashinfer"}, "wrong_answers": true, "tokens_per_second": 500},
                   {"when": {"fp4_gemm_backend": "flashinfer_cudnn", "speculative_algorithm": "none"},
                    "fail_start": "CUDNN_STATUS_NOT_SUPPORTED: no engine for this FP4 GEMM on sm_120"}]}

    A rule applies when every key of "when" equals the launch's value (speculative_algorithm "none" when off; the
    stack's versions as load_stack reads them: sglang, torch, cuda, flashinfer, sgl_kernel);
    later rules override earlier ones. tokens_per_second: completion tokens are really emitted at that rate (the
    reply waits for them); load_seconds: time to /health 200; wrong_answers: garbage text; fail_start: the message
    the launch dies with."""

    def __init__(self, values: dict | None = None):
        values = values or {}
        # a real server decodes at some finite rate: without one, a probe would time only the network
        self.tokens_per_second = values.get("tokens_per_second", DEFAULT_TOKENS_PER_SECOND)
        self.load_seconds = values.get("load_seconds")
        self.wrong_answers = bool(values.get("wrong_answers"))
        self.fail_start = values.get("fail_start") or None

    @classmethod
    def of(cls, args: argparse.Namespace, path: str = BACKENDS_FILE, versions: dict | None = None) -> "Behaviour":
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            return cls()
        # a rule may also name the stack it runs on ({"when": {"torch": "2.12.0.dev20260307+cu130"}}): a new stack
        # that decodes slower than the old is one whose versions a rule makes slower
        chosen = {**(versions or {}), **backend_values(args)}
        merged = dict(data.get("default") or {})
        for rule in data.get("rules") or []:
            if all(str(chosen.get(k)) == str(v) for k, v in (rule.get("when") or {}).items()):
                merged.update({k: v for k, v in rule.items() if k != "when"})
        return cls(merged)


def backend_values(args: argparse.Namespace) -> dict[str, str]:
    """The launch's backend set, named as in BACKENDS_FILE rules."""
    return {"attention_backend": args.attention_backend or "auto", "moe_runner_backend": args.moe_runner_backend,
            "fp4_gemm_backend": args.fp4_gemm_backend,
            "speculative_algorithm": (args.speculative_algorithm or "none").upper().replace("NONE", "none")}


BEHAVIOUR = Behaviour()


def answer(prompt: str, max_tokens: int | None = None) -> str:
    """Known questions get their answer; any other prompt a text of max_tokens words (a long generation)."""
    if garbage_output() or BEHAVIOUR.wrong_answers:
        # A broken kernel still generates at full length: garbage, token after token.
        return " ".join(["!!!!!!!!!!!!!!!!"] * max(1, min(max_tokens or 1, 4096)))
    lowered = prompt.lower()
    for question, reply in KNOWN_ANSWERS.items():
        if question in lowered:
            return reply
    if max_tokens:
        return " ".join(f"w{i}" for i in range(max_tokens))
    return f"This is a simulated answer to: {' '.join(prompt.split()[:12])}"


def emit_at_rate(text: str) -> None:
    """Wait as long as generating text's tokens takes at the backend set's rate."""
    if BEHAVIOUR.tokens_per_second:
        time.sleep(len(text.split()) / float(BEHAVIOUR.tokens_per_second))


def check_model(model_path: str) -> None:
    if not (Path(model_path) / "config.json").is_file():
        raise OSError(f"{model_path} does not appear to have a file named config.json.")


def load_stack() -> dict[str, str]:
    """Import the kernel stack as the real server does at start; an import failure ends the launch."""
    import flashinfer
    import sgl_kernel
    import torch

    import sglang

    versions = {"sglang": sglang.__version__, "torch": torch.__version__, "cuda": str(torch.version.cuda),
                "flashinfer": flashinfer.__version__, "sgl_kernel": sgl_kernel.__version__}
    for name, version in versions.items():
        logger.info("%s version: %s", name, version)
    return versions


def check_gpus(tp: int) -> tuple[int, int]:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("No CUDA GPUs are available")
    if tp > torch.cuda.device_count():
        raise RuntimeError(f"--tp {tp} needs {tp} GPUs, but only {torch.cuda.device_count()} are visible")
    capability = torch.cuda.get_device_capability(0)
    logger.info("GPU: %s x%d, compute capability %d.%d", torch.cuda.get_device_name(0),
                torch.cuda.device_count(), *capability)
    return capability


class _TensorParallelGroup:
    """What TorchSymmMemCommunicator reads of the tensor-parallel ProcessGroup (the stand-in has no torch.distributed):
    its size, as dist.get_world_size(group) gives it, and its name."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.group_name = "tp"

    def size(self) -> int:
        return self.world_size


def setup_symm_mem(tp: int, major: int | None = None) -> dict:
    """Create the communicator as sglang's parallel state does, for rank 0 (device 0) of the TP group. The newer
    communicator raises RuntimeError where the older one disables itself; both leave the server running without it.
    A KeyError (no table row for the GPU's capability) ends the launch, as it does upstream."""
    from sglang.srt.distributed.device_communicators.torch_symm_mem import TorchSymmMemCommunicator

    try:
        comm = TorchSymmMemCommunicator(_TensorParallelGroup(tp), 0)
    except RuntimeError as exc:
        logger.warning("%s", exc)
        info = {"disabled": True, "kernel": None, "max_size": None}
        logger.info("torch symm-mem all-reduce: %s", info)
        return info
    info = {"disabled": comm.disabled, "kernel": None if comm.disabled else comm.kernel,
            "max_size": getattr(comm, "max_size", None)}
    logger.info("torch symm-mem all-reduce: %s", info)
    return info


class State:
    def __init__(self, args: argparse.Namespace, versions: dict[str, str], extra: dict):
        self.args = args
        self.versions = versions
        self.extra = extra
        self.model_name = args.served_model_name or Path(args.model_path.rstrip("/")).name
        load = BEHAVIOUR.load_seconds if BEHAVIOUR.load_seconds is not None else os.environ.get("SGLANG_SIM_WARMUP", "2")
        self.ready_at = time.monotonic() + float(load)
        self.created = int(time.time())
        self.in_flight = InFlight()  # requests being generated now (/get_load, /metrics)

    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at


def health_status(state: State) -> int:
    if failing_health():
        return 500
    return 200 if state.ready() else 503


def prompt_of_messages(messages: list) -> str:
    parts = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        parts.append(str(content))
    return "\n".join(parts)


def usage(prompt: str, text: str) -> dict:
    prompt_tokens, completion_tokens = len(prompt.split()), len(text.split())
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def generate_reply(state: State, body: dict) -> dict:
    prompt = body.get("text") or ""
    prompt = prompt[0] if isinstance(prompt, list) and prompt else str(prompt)
    text = answer(prompt, (body.get("sampling_params") or {}).get("max_new_tokens"))
    emit_at_rate(text)
    meta = {"id": uuid.uuid4().hex, "finish_reason": {"type": "stop", "matched": None}, **usage(prompt, text)}
    return {"text": text, "meta_info": meta}


def chat_reply(state: State, body: dict) -> dict:
    prompt = prompt_of_messages(body.get("messages") or [])
    text = answer(prompt, body.get("max_tokens") or body.get("max_completion_tokens"))
    emit_at_rate(text)
    return {
        "id": uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or state.model_name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                             "tool_calls": None}, "logprobs": None, "finish_reason": "stop",
                     "matched_stop": None}],
        "usage": usage(prompt, text),
    }


def completion_reply(state: State, body: dict) -> dict:
    prompt = str(body.get("prompt") or "")
    text = answer(prompt, body.get("max_tokens"))
    emit_at_rate(text)
    return {"id": uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
            "model": body.get("model") or state.model_name,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
            "usage": usage(prompt, text)}


def models_reply(state: State) -> dict:
    return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": state.created,
                                        "owned_by": "sglang", "root": state.model_name,
                                        "max_model_len": state.args.context_length}]}


def model_info_reply(state: State) -> dict:
    return {"model_path": state.args.model_path, "tokenizer_path": state.args.model_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default"}


def server_info_reply(state: State) -> dict:
    return {**vars(state.args), "version": state.versions.get("sglang"), "versions": state.versions, **state.extra}


GETS = {
    "/v1/models": models_reply,
    "/model_info": model_info_reply,
    "/get_model_info": model_info_reply,
    "/server_info": server_info_reply,
    "/get_server_info": server_info_reply,
}
POSTS = {"/generate": generate_reply, "/v1/chat/completions": chat_reply, "/v1/completions": completion_reply}


class InFlight:
    """Requests being generated now, counted as real SGLang reports them (running + waiting), and a log of every
    request served (when it began and ended, from which address), for tests that ask who reached a drained host."""

    def __init__(self):
        self.count = 0
        self.served = 0  # generations finished since the start
        self.lock = threading.Lock()

    def __enter__(self):
        with self.lock:
            self.count += 1
        return self

    def __exit__(self, *exc):
        with self.lock:
            self.count -= 1
            self.served += 1


REQUEST_LOG = os.environ.get("SGLANG_SIM_REQUEST_LOG", "/var/log/gpufleet-sim/requests.jsonl")
_LOG_LOCK = threading.Lock()


def log_request(path: str, client: str, began: float, ended: float, status: int) -> None:
    line = json.dumps({"path": path, "client": client, "began": began, "ended": ended, "status": status})
    try:
        with _LOG_LOCK:
            os.makedirs(os.path.dirname(REQUEST_LOG), exist_ok=True)
            with open(REQUEST_LOG, "a") as f:
                f.write(line + "\n")
    except OSError:
        pass  # a log the server cannot write never fails a request


def load_reply(state: State) -> list:
    """/get_load as sglang's http_server serves it: one entry per DP rank; num_reqs = running + waiting."""
    return [{"dp_rank": 0, "num_reqs": state.in_flight.count, "num_waiting_reqs": 0, "num_tokens": 0}]


GETS["/get_load"] = load_reply


def metrics_text(state: State) -> str:
    """/metrics (sglang --enable-metrics): the scheduler's gauges, Prometheus text format."""
    labels = '{engine_type="unified",model_name="%s",tp_rank="0",pp_rank="0"}' % state.model_name
    return ("# HELP sglang:num_running_reqs The number of running requests.\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{labels} {float(state.in_flight.count)}\n"
            "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
            "# TYPE sglang:num_queue_reqs gauge\n"
            f"sglang:num_queue_reqs{labels} 0.0\n")


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""
    state: State

    def log_message(self, fmt: str, *args) -> None:
        logger.info("%s - %s", self.address_string(), fmt % args)

    def send_json(self, status: int, payload) -> None:
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            self.send_json(health_status(self.state), None)
        elif path == "/metrics":
            body = metrics_text(self.state).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif path in GETS:
            self.send_json(200, GETS[path](self.state))
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in POSTS:
            self.send_json(404, {"detail": "Not Found"})
            return
        if not self.state.ready() or failing_health():
            self.send_json(503, {"error": {"message": "The server is not ready yet.", "code": 503}})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        except ValueError:
            self.send_json(400, {"error": {"message": "Invalid JSON body", "code": 400}})
            return
        began = time.time()
        with self.state.in_flight:
            reply = POSTS[path](self.state, body)
        log_request(path, self.client_address[0], began, time.time(), 200)
        self.send_json(200, reply)


def announce_ready(state: State) -> None:
    time.sleep(max(0.0, state.ready_at - time.monotonic()))
    if not failing_health():
        logger.info("The server is fired up and ready to roll!")


def fail_start(args: argparse.Namespace, message: str) -> None:
    """Die during load as the real server does when a backend cannot run: the scheduler's traceback, exit 1."""
    time.sleep(float(BEHAVIOUR.load_seconds or 0) / 2)
    logger.info("backends: %s", backend_values(args))
    logger.error("Scheduler hit an exception: Traceback (most recent call last):\n"
                 '  File "sglang/srt/managers/scheduler.py", line 2615, in run_scheduler_process\n'
                 '  File "sglang/srt/model_executor/model_runner.py", line 411, in initialize\n'
                 "RuntimeError: %s", message)
    logger.error("Received sigquit from a child process. It usually means the child failed.")
    sys.exit(1)


def launch(argv: list[str]) -> None:
    global BEHAVIOUR
    args, ignored = parse_args(argv)
    logger.info("server_args=%s ignored=%s", vars(args), ignored)
    check_model(args.model_path)
    versions = load_stack()
    major, _ = check_gpus(args.tp)
    BEHAVIOUR = Behaviour.of(args, os.environ.get("SGLANG_SIM_BACKENDS", BACKENDS_FILE), versions)
    if BEHAVIOUR.fail_start:
        fail_start(args, str(BEHAVIOUR.fail_start))
    extra = {"torch_symm_mem": setup_symm_mem(args.tp, major)} if args.enable_torch_symm_mem else {}
    server = _Server((args.host, args.port), Handler)
    Handler.state = State(args, versions, extra)
    threading.Thread(target=announce_ready, args=(Handler.state,), daemon=True).start()
    logger.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", args.host, args.port)
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", stream=sys.stderr)
    launch(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
