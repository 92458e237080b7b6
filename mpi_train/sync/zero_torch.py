"""zero_torch: torch's ZeroRedundancyOptimizer under DistributedDataParallel: the optimizer state sharded (ZeRO-1)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from .base import OPTIMIZER_STATE
from .ddp import DDP
from .traits import RING_THEN_BROADCAST


class ZeroTorch(DDP):
    """torch's ZeRO-1, as the peer of `zero` (ddp is bucketed's): DDP averages every gradient in backward as usual;
    the optimizer is a ZeroRedundancyOptimizer, which gives each rank the parameters of about 1/N of the model
    (whole tensors, balanced by size) to step and keep state for, then broadcasts each rank's updated parameters
    from their owner. Bytes per rank: DDP's 2(N-1)/N·S, then each rank's own share sent to the N-1 others; memory
    per rank P + G + O/N.

    Checkpoints consolidate the state on rank 0 (consolidate_state_dict) in an unsharded optimizer's layout, so a job
    resumes under any method and, with --reshard, on another number of ranks; on loading each rank keeps its share.
    """

    # DDP's allreduce, then each owner's parameters sent
    traits = replace(DDP.traits, family=RING_THEN_BROADCAST, shards=OPTIMIZER_STATE,
                     no_compression_because="it runs under plain DistributedDataParallel, whose compression is torch's "
                                            "communication hooks (--sync ddp_fp16, ddp_powersgd)")

    def make_optimizer(self, model: nn.Module, build: Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
                       ) -> torch.optim.Optimizer:
        """The optimizer `build` makes, its class and settings taken over by a ZeroRedundancyOptimizer."""
        template = build(model.parameters())  # holds no state until it steps: only its class and defaults are read
        # the settings its constructor takes: AdamW's defaults also hold decoupled_weight_decay, which it sets itself
        accepted = inspect.signature(type(template)).parameters
        settings = {key: value for key, value in template.defaults.items() if key in accepted}
        # imported here: torch.distributed.optim brings in FSDP and DTensor, 0.6 s of import in every process
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(template), **settings)

    def _optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> dict | None:
        optimizer.consolidate_state_dict(to=0)  # collective: every rank sends its shard's state to rank 0
        return optimizer.state_dict() if dist.get_rank() == 0 else None
