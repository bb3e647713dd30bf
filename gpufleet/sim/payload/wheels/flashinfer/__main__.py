"""`flashinfer show-config`: what this install holds."""

from __future__ import annotations

import sys


def show_config() -> None:
    import torch

    import flashinfer
    from flashinfer.jit.env import companion_version

    print("=== Version Info ===")
    print(f"FlashInfer version: {flashinfer.__version__}")
    print(f"flashinfer-cubin version: {companion_version('flashinfer_cubin') or 'Not installed'}")
    print(f"flashinfer-jit-cache version: {companion_version('flashinfer_jit_cache') or 'Not installed'}")
    print("\n=== Torch Version Info ===")
    print(f"Torch version: {torch.__version__}")
    print(f"CUDA runtime available: {torch.cuda.is_available()}")
    print(f"CUDA version: {torch.version.cuda}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["show-config"]:
        print("usage: flashinfer show-config", file=sys.stderr)
        return 2
    show_config()
    return 0


if __name__ == "__main__":
    sys.exit(main())
