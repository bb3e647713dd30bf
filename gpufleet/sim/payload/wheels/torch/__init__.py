"""Stand-in torch for the simulated fleet: versions and device facts only, no tensors."""

from torch import _C, cuda, version
from torch._ops import ops
from torch.version import __version__

__all__ = ["_C", "cuda", "ops", "version", "__version__"]
