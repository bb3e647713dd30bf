"""The roles, in the order the engine plans and applies them; each is a module with `name` and `plan(ctx)`."""

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
