"""The role registry, in the order the engine plans and applies them; each is a module with `name`, `plan(ctx)` and
`declares` (what it owns: status, the lock, verify and the stack's package list read it from here)."""

from gpufleet.roles import flashinfer, locked_packages, sgl_kernel, sglang_checkout, torch, verify

ROLES = [
    torch,
    flashinfer,
    locked_packages,  # with a fleet lock: every other distribution at its locked version
    sglang_checkout,  # pull with the local edits kept, then the site's sglang patches
    sgl_kernel,  # after torch and the checkout: its build key is made of both
    verify,  # last: the whole stack must import together
]

__all__ = ["ROLES"]
