"""Secrets on the wire: what a become host's sudo logs (its command line, into the journal) holds no secret, and what
is shown or logged masks every registered secret, even one a planner pasted into a script as plain text."""

from __future__ import annotations

import pytest

from gpufleet.config.stack import Stack
from gpufleet.engine.become import Become, wire
from gpufleet.engine.command import MASK, Cmd, Secret, mask
from gpufleet.roles import pip
from gpufleet.testing.context import plan_context

PASSWORD = "gfiUNITindexPASS"
INDEX = f"https://ops:{PASSWORD}@index.example.net/simple"


def credentialed_stack() -> Stack:
    return Stack.model_validate({"pip": {"index_url": INDEX, "extra_index_urls": [INDEX]},
                                 "torch": {"index_url": INDEX}})


def test_an_index_password_pasted_into_a_plain_script_is_still_masked_when_shown():
    cmd = pip.install_cmd(plan_context(stack=credentialed_stack()), ["cmake>=3.31"], index_url=INDEX)
    pasted = Cmd.of("bash", "-c", f"cd / && {cmd.render()}")  # the secret is plain text here
    assert PASSWORD in pasted.render()
    assert PASSWORD not in pasted.display() and MASK in pasted.display()
    assert mask(f"pip: fetching {INDEX}/torch/ (password {PASSWORD})", ()) == f"pip: fetching {MASK}/torch/ (password {MASK})"


def test_a_secret_argument_reaches_sudo_on_stdin_not_on_its_command_line():
    cmd = pip.install_cmd(plan_context(stack=credentialed_stack()), ["cmake>=3.31"], index_url=INDEX)
    wired = wire(cmd, Become("root", "sudo-pw"))
    assert PASSWORD not in wired.text and PASSWORD not in wired.shown
    assert wired.stdin.startswith(b"sudo-pw\n") and len(wired.stdin.splitlines()) == 2


def test_sgl_kernel_build_tools_step_keeps_the_index_password_off_sudos_command_line():
    from gpufleet.roles import sgl_kernel

    cmd = sgl_kernel._tools_cmd(plan_context(stack=credentialed_stack()), ["cmake>=3.31"])
    assert PASSWORD not in wire(cmd, Become("root", "sudo-pw")).text


def test_short_values_are_not_registered_for_free_text_masking():
    Secret("ab")
    assert mask("ab cd", ()) == "ab cd"
