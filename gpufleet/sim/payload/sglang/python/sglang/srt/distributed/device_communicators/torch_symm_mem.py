# Adapted from https://github.com/vllm-project/vllm/blob/bf214ca22625e311a2c4c0dfbf7af19128f4919c/vllm/distributed/device_communicators/symm_mem.py
# gpufleet simulated sglang: upstream's torch_symm_mem.py (sgl-project/sglang, the file version stored at commit
# 5a7255c6fb5709a643e9a0bf22dbba12d4c424a8) with its table imports, class line, _WORLD_SIZES_MULTIMEM and __init__
# signature as upstream writes them; the body keeps upstream's checks, without symmetric memory or collectives.
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Union

import torch

from sglang.srt.distributed.device_communicators.all_reduce_utils import (
    TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)


class TorchSymmMemCommunicator:
    """
    Thin wrapper around torch-symmetric-memory collectives.

    This communicator:
      - Validates device capability and world size.
      - Chooses between 'multimem' and 'two-shot' all-reduce kernels.

    If any prerequisite is not met, the instance remains disabled and will
    decline to perform symmetric-memory all-reduce.
    """

    # Mapping: compute capability major -> supported world sizes for multimem
    # If the current (cc_major, world_size) is not listed, we fall back
    # to the two-shot path.
    _WORLD_SIZES_MULTIMEM = {
        9: [4, 6, 8],
        10: [6, 8],
    }

    def __init__(self, group: ProcessGroup, device: Union[int, str, torch.device]):
        """
        Args:
            group: Torch process group used for rendezvous and naming.
            device: Target CUDA device (index, 'cuda:X', or torch.device).
        """

        self.disabled = True

        torch.cuda.set_device(device)
        self.device = device
        self.group = group
        # upstream: dist.get_world_size(self.group)
        self.world_size = group.size()
        self.device_capability = torch.cuda.get_device_capability(device)[0]
        if self.device_capability < 9:
            logger.warning(
                "TorchSymmMemCommunicator: Device capability %s not supported, "
                "communicator is not available.",
                self.device_capability,
            )
            return
        if (
            self.world_size
            not in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]
        ):
            logger.warning(
                "TorchSymmMemCommunicator: World size %d not supported, "
                "communicator is not available.",
                self.world_size,
            )
            return
        self.max_size = TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability][
            self.world_size
        ]
        self.disabled = False

    @property
    def kernel(self) -> Optional[str]:
        """The all-reduce all_reduce() would run: upstream indexes _WORLD_SIZES_MULTIMEM by capability there."""
        if self.disabled:
            return None
        if self.world_size in self._WORLD_SIZES_MULTIMEM[self.device_capability]:
            return "multimem"
        return "two_shot"
