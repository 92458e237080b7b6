"""allreduce: one all_reduce(SUM) per parameter, then divide by the world size."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from .base import EVERY_COMPRESSION, SyncMethod, sum_each_round
from .messages import PER_TENSOR
from .traits import RING_ALLREDUCE, Traits


class AllReduce(SyncMethod):
    """Per-layer allreduce: bandwidth-optimal per call, but one latency-bound call per tensor (per round,
    compressed)."""

    traits = Traits(family=RING_ALLREDUCE, messages=PER_TENSOR, compressions=EVERY_COMPRESSION)

    def sync(self, model: nn.Module) -> None:
        world = dist.get_world_size()
        for index, p in enumerate(model.parameters()):
            if p.grad is not None:
                sum_each_round(self.compressor.rounds((p,), p.grad, (p.grad,), world), dist.all_reduce, self._recorder,
                               "allreduce", index)
