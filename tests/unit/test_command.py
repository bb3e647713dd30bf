"""Commands as data: exact rendering, quoting in one place, secrets masked everywhere they are shown."""

from gpufleet.engine.command import MASK, Cmd, Raw, Secret, mask
from gpufleet.engine.ssh import Result
from gpufleet.errors import RemoteCommandError


def test_render_quotes_every_argument():
    cmd = Cmd.of("pip", "install", "torch==2.12.0.dev20260307+cu130", "--index-url", "https://x/y z")
    assert cmd.render() == "pip install torch==2.12.0.dev20260307+cu130 --index-url 'https://x/y z'"


def test_env_and_cwd():
    cmd = Cmd.of("make", "build", env={"TORCH_CUDA_ARCH_LIST": "12.0a", "MAX_JOBS": 4}, cwd="/root/sglang main")
    assert cmd.render() == "cd '/root/sglang main' && env MAX_JOBS=4 TORCH_CUDA_ARCH_LIST=12.0a make build"


def test_secret_is_sent_but_never_displayed():
    cmd = Cmd.of("huggingface-cli", "login", "--token", Secret("hf_abc123"), env={"HF_TOKEN": Secret("hf_abc123")})
    assert "hf_abc123" in cmd.render()
    assert "hf_abc123" not in cmd.display()
    assert cmd.display().count(MASK) == 2
    assert "hf_abc123" not in str(cmd) and "hf_abc123" not in repr(Secret("hf_abc123"))
    assert cmd.secrets() == ["hf_abc123", "hf_abc123"]


def test_shell_injection_is_quoted():
    cmd = Cmd.of("echo", "$(rm -rf /); `id`")
    assert cmd.render() == "echo '$(rm -rf /); `id`'"


def test_raw_passes_shell_syntax():
    assert Cmd.of("journalctl", "-u", "sglang", Raw("|"), "tail", "-n", 5).render() == "journalctl -u sglang | tail -n 5"


def test_mask_free_text_longest_first():
    assert mask("token abc and abcdef", ["abc", "abcdef"]) == f"token {MASK} and {MASK}"
    assert mask("nothing", [""]) == "nothing"


def test_remote_error_names_host_step_command_code_and_tail():
    cmd = Cmd.of("pip", "install", "torch==9")
    result = Result("gpu1", "torch", cmd.display(), 1, "line1\nERROR: No matching distribution", 0.0)
    err = RemoteCommandError(result, cmd)
    text = str(err)
    for part in ("gpu1", "torch", "pip install torch==9", "exit code 1", "No matching distribution"):
        assert part in text
    assert err.result is result and err.cmd is cmd  # kept for callers, as Invoke's Failure keeps its result
    lost = RemoteCommandError(Result("gpu1", "build", "make", None, "", 0.0))
    assert "connection lost" in str(lost) and lost.cmd is None


def test_remote_error_may_show_the_command_abbreviated():
    cmd = Cmd.of("python", "-c", "import x\nx.y()\n")
    err = RemoteCommandError(Result("gpu1", "s", cmd.display(), 2, "", 0.0), cmd, shown="python -c <script>")
    assert "`python -c <script>` returned exit code 2" in str(err) and err.result.command == cmd.display()
