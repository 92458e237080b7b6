"""allreduce: one all_reduce(SUM) per parameter, then divide by the world size."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from .base import SyncMethod, gradients


class AllReduce(SyncMethod):
    """Per-layer allreduce: bandwidth-optimal per call, but one latency-bound call per tensor."""

    cost_model = "ring"

    def sync(self, model: nn.Module) -> None:
        world = dist.get_world_size()
        for grad in gradients(model):
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)
            grad.div_(world)
