"""ddp_powersgd: DistributedDataParallel with torch's powerSGD_hook, the DDP user's low-rank compression."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from .compression.powersgd import MIN_COMPRESSION, PowerSGD
from .ddp import DDP

TORCH_FIRST_COMPRESSED_STEP = 2  # powerSGD_hook refuses start_powerSGD_iter <= 1 with error feedback or warm start

GLOO_FAILURE = (
    f"torch's powerSGD_hook does not work on the Gloo backend (torch {torch.__version__}): with 2 ranks training "
    f"VGG-11 it aborts the whole process with a collective size mismatch (\"Received data size doesn't match "
    f"expected size\"), and batched_powerSGD_hook fails an assertion. It needs NCCL (a GPU per rank: --backend "
    f"nccl). On CPUs use our own PowerSGD, which works on Gloo: --sync bucketed --compression powersgd "
    f"(same --powersgd-rank and --powersgd-start-step)"
)


class DDPPowerSGD(DDP):
    """DDP plus torch's PowerSGD hook with our rank, start step and least compression, error feedback and warm start
    on."""

    traits = replace(DDP.traits, fixed_compression="powersgd", unsupported_backends={"gloo": GLOO_FAILURE})

    def __init__(self, compressor: PowerSGD | None = None, find_unused: bool = False):
        super().__init__(compressor or PowerSGD(), find_unused)

    def comm_hook(self) -> tuple:
        state = powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=self.compressor.rank,
            start_powerSGD_iter=max(TORCH_FIRST_COMPRESSED_STEP, self.compressor.start_step),
            min_compression_rate=MIN_COMPRESSION,
            use_error_feedback=True, warm_start=True)
        return state, powersgd.powerSGD_hook
