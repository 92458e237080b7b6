"""ddp_fp16: DistributedDataParallel with torch's fp16_compress_hook, the DDP user's float16 compression."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from .ddp import DDP


class DDPFP16(DDP):
    """Each bucket divided by N, cast to float16, allreduced and cast back, inside backward (our `bucketed` + fp16's
    peer)."""

    traits = replace(DDP.traits, fixed_compression="fp16", wire_dtype=torch.float16)

    def comm_hook(self) -> tuple:
        return None, default_hooks.fp16_compress_hook
