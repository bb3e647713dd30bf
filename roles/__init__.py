"""The roles, in the order the engine plans and applies them; each is a module with `name` and `plan(ctx)`."""

from roles import flashinfer, torch, verify

ROLES = [
    torch,
    flashinfer,
    # the sglang checkout role goes here (pull, local edits / patches), then the sgl-kernel role (build or install)
    verify,  # last: the whole stack must import together
]

__all__ = ["ROLES"]
