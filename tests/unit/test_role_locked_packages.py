"""The locked-packages planner with fake facts (no SSH), and a lock's recorded hashes for handed-over wheels."""

from __future__ import annotations

import json

import pytest

from gpufleet.testing.context import plan_context
from gpufleet.facts.model import HostFacts
from gpufleet.config.inventory import Host
from gpufleet.config.lock import FleetLock, LockKernel, LockMeta, LockSglang, LockWheel
from gpufleet.plan import PlanContext, PlanError, Step, Unchanged, Upload
from gpufleet.wheels.wheelset import WheelRef
from gpufleet.roles import locked_packages
from gpufleet.roles.pip import WHEEL_DIR, handed_over
from tests.unit.pipfakes import PIP_WHEEL, RESOLVER, report, resolving_probe

TORCH = "2.12.0.dev20260307+cu130"
LOCK_PATH = "/srv/gpufleet/locks/20260308T100000Z-gpu1.toml"
LOCKED = {"torch": TORCH, "triton": "3.6.0", "numpy": "2.3.0", "sglang": "0.5.9", "sgl-kernel": "0.3.16",
          "my-plugin": "1.0"}
CONSTRAINTS = f"my-plugin==1.0\nnumpy==2.3.0\ntorch=={TORCH}\ntriton==3.6.0"
TRITON_FILE = "triton-3.6.0-py3-none-any.whl"
TRITON_SHA = "7" * 64
ROLE = "locked-packages"


def fleet_lock(packages=LOCKED, wheels=()) -> FleetLock:
    return FleetLock(lock=LockMeta(format=1, created="2026-03-08T10:00:00Z", canary="gpu1"),
                     sglang=LockSglang(commit="0123abc", patches="a" * 64),
                     sgl_kernel=LockKernel(patches="b" * 64), packages=packages, wheels=list(wheels), path=LOCK_PATH)


def ctx(packages, *, found: FleetLock | None = None, editables=None, probe=None) -> PlanContext:
    facts = HostFacts(host="gpu2", packages=packages, editables=editables)
    return plan_context(host=Host(name="gpu2", address="10.0.0.2"), facts=facts, read=probe,
                        resolver=lambda: RESOLVER, lock=found)


def at_lock(**changed) -> dict[str, str]:
    have = dict(LOCKED)
    for name, version in changed.items():
        name = name.replace("_", "-")
        if version is None:
            have.pop(name)
        else:
            have[name] = version
    return have


def planned(packages, *, found=None, editables=None, answer=None) -> tuple[Step, object]:
    probe = resolving_probe({ROLE: answer if answer is not None else report(("numpy", "2.3.0"), ("triton", "3.6.0"))},
                            host="gpu2")
    [step] = locked_packages.plan(ctx(packages, found=found or fleet_lock(), editables=editables, probe=probe))
    assert isinstance(step, Step)
    return step, probe


# --- plan ------------------------------------------------------------------------------------------------------

def test_without_a_lock_there_is_nothing_to_plan() -> None:
    assert locked_packages.plan(ctx({"torch": "2.9.1"})) == []


def test_everything_at_its_locked_version_is_one_unchanged_naming_the_lock() -> None:
    # torch as pip lists it (no +cu130), sglang and sgl-kernel elsewhere (not this role's), an extra distribution
    have = at_lock(torch="2.12.0.dev20260307", sglang="0.5.8", sgl_kernel=None, rich="15.0.0")
    assert locked_packages.plan(ctx(have, found=fleet_lock())) == [
        Unchanged(ROLE, f"every distribution of {LOCK_PATH} is installed at its locked version")]


def test_host_names_are_compared_canonically() -> None:
    have = {("My_Plugin" if n == "my-plugin" else n): v for n, v in LOCKED.items()}
    [item] = locked_packages.plan(ctx(have, found=fleet_lock()))
    assert isinstance(item, Unchanged)


def test_differing_and_missing_distributions_give_one_step() -> None:
    step, probe = planned(at_lock(triton="3.5.0", numpy=None))
    assert step.role == ROLE and step.title == "install 2 locked distribution(s)"
    assert step.reason == (f"the lock {LOCK_PATH} (proven on gpu1) has numpy (absent) -> 2.3.0, "
                           f"triton 3.5.0 -> 3.6.0")
    assert step.changes == ("venv",)
    [(asked, _)] = probe.asked
    assert asked == f"{ROLE}: resolve numpy==2.3.0 triton==3.6.0"


def test_the_host_resolves_exactly_the_differing_pins_under_the_locks_constraints() -> None:
    _, probe = planned(at_lock(triton="3.5.0", numpy=None))
    argv = list(probe.asked[0][1].argv)
    assert argv[:4] == ["bash", "-c", argv[2], "resolve"]
    assert argv[4] == CONSTRAINTS  # sglang and sgl-kernel are never pinned from an index
    assert argv[5:10] == ["/root/venv/bin/python", f"{PIP_WHEEL}/pip", "install", "--dry-run", "--quiet"]
    assert argv[argv.index("--index-url") + 1] == "https://pypi.org/simple"
    assert argv[-2:] == ["numpy==2.3.0", "triton==3.6.0"]


def test_the_install_is_offline_and_carries_the_constraints() -> None:
    step, _ = planned(at_lock(triton="3.5.0", numpy=None))
    [cmd] = step.commands
    assert dict(cmd.env)["CONSTRAINTS"] == CONSTRAINTS
    argv = list(cmd.argv)
    assert argv[argv.index("--no-index"):] == ["--no-index", "--find-links", WHEEL_DIR, "numpy==2.3.0",
                                               "triton==3.6.0"]
    assert step.uploads[0] == RESOLVER
    assert [(u.name, u.remote) for u in step.uploads[1:]] == [
        ("numpy", f"{WHEEL_DIR}/numpy-2.3.0-py3-none-any.whl"),
        ("triton", f"{WHEEL_DIR}/triton-3.6.0-py3-none-any.whl")]


def test_needed_checks_the_differing_pins_and_what_pip_resolved() -> None:
    answer = report(("numpy", "2.3.0"), ("triton", "3.6.0"), ("filelock", "3.20.0"))
    step, _ = planned(at_lock(triton="3.5.0", numpy=None), answer=answer)
    assert json.loads(step.needed.argv[-1]) == {"numpy": "2.3.0", "triton": "3.6.0", "filelock": "3.20.0"}


def test_a_torch_from_another_build_is_reinstalled() -> None:
    _, probe = planned(at_lock(torch="2.12.0.dev20260307+cu128"), answer=report(("torch", TORCH)))
    assert probe.asked[0][0] == f"{ROLE}: resolve torch=={TORCH}"


def test_editables_are_left_alone() -> None:
    # the editable my-plugin is at another version: the lock does not reinstall it from an index
    have = at_lock(triton="3.5.0", my_plugin="1.1.dev0")
    step, probe = planned(have, editables={"My_Plugin": "/root/my-plugin"}, answer=report(("triton", "3.6.0")))
    assert probe.asked[0][0] == f"{ROLE}: resolve triton==3.6.0"
    assert "my-plugin" not in step.reason
    only_editable = locked_packages.plan(ctx(at_lock(my_plugin="1.1.dev0"), found=fleet_lock(),
                                             editables={"my-plugin": "/root/my-plugin"}))
    assert [type(i) for i in only_editable] == [Unchanged]


def test_unreadable_package_list_is_a_plan_error() -> None:
    facts_less = ctx(None, found=fleet_lock())
    facts_less.facts.problems.append("packages: pip list failed")
    with pytest.raises(PlanError, match=r"locked-packages cannot plan: the venv's packages could not be read "
                                        r"\(packages: pip list failed\)"):
        locked_packages.plan(facts_less)


def test_the_locks_hash_is_used_when_the_index_publishes_none() -> None:
    found = fleet_lock(wheels=[LockWheel(name="triton", version="3.6.0", filename=TRITON_FILE, sha256=TRITON_SHA)])
    step, _ = planned(at_lock(triton="3.5.0", numpy=None), found=found,
                      answer=report(("numpy", "2.3.0"), ("triton", "3.6.0"), hashed=False))
    assert [(u.name, u.sha256) for u in step.uploads[1:]] == [("numpy", None), ("triton", TRITON_SHA)]


# --- handed_over: the lock's recorded hashes -------------------------------------------------------------------

def ref(sha: str | None, filename: str = TRITON_FILE) -> WheelRef:
    return WheelRef("triton", "3.6.0", filename, f"http://10.0.0.1:8765/files/{filename}", sha)


def lock_ctx() -> PlanContext:
    found = fleet_lock(wheels=[LockWheel(name="triton", version="3.6.0", filename=TRITON_FILE, sha256=TRITON_SHA)])
    return ctx(dict(LOCKED), found=found)


def test_handed_over_takes_the_locks_hash_for_a_file_the_index_does_not_hash() -> None:
    assert handed_over(lock_ctx(), ROLE, [ref(None)]) == (
        Upload(f"http://10.0.0.1:8765/files/{TRITON_FILE}", TRITON_SHA, f"{WHEEL_DIR}/{TRITON_FILE}", "triton",
               "3.6.0"),)


def test_handed_over_accepts_the_same_hash_and_leaves_other_files_alone() -> None:
    other = "triton-3.6.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    uploads = handed_over(lock_ctx(), ROLE, [ref(TRITON_SHA), ref(None, other), ref("8" * 64, other)])
    assert [u.sha256 for u in uploads] == [TRITON_SHA, None, "8" * 64]


def test_handed_over_without_a_lock_keeps_the_index_hash() -> None:
    assert [u.sha256 for u in handed_over(ctx({}), ROLE, [ref(None), ref("8" * 64)])] == [None, "8" * 64]


def test_handed_over_refuses_another_file_under_a_locked_name() -> None:
    with pytest.raises(PlanError) as info:
        handed_over(lock_ctx(), ROLE, [ref("8" * 64)])
    text = str(info.value)
    assert text.startswith("host gpu2: role locked-packages cannot plan:")
    for part in (TRITON_FILE, "8" * 64, TRITON_SHA, LOCK_PATH, "refusing a different file under the same name"):
        assert part in text, f"{part!r} not in {text!r}"


def test_locked_distributions_are_looked_for_on_every_index_of_the_stack():
    # triton and nvidia-* may live on the torch index only; the pins are exact either way
    _, probe = planned(at_lock(triton="3.5.1"))
    [(_, cmd)] = [a for a in probe.asked if ": resolve " in a[0]]
    argv = list(cmd.argv)
    assert argv[argv.index("--index-url") + 1] == "https://pypi.org/simple"
    extras = [argv[i + 1] for i, a in enumerate(argv) if a == "--extra-index-url"]
    assert extras == ["https://download.pytorch.org/whl/nightly/cu130", "https://flashinfer.ai/whl/cu130"]
    assert "--pre" in argv  # the torch index's nightlies are pre-releases
