"""gather_scatter: rank 0 gathers each gradient, averages, and scatters the mean back."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..timeline import timed
from .base import SyncMethod, gradients
from .messages import PER_TENSOR
from .traits import ROOT, Traits


class GatherScatter(SyncMethod):
    """The textbook parameter-server pattern: all traffic goes through rank 0, one layer at a time.

    Rank 0 receives (N-1)·S bytes and sends (N-1)·S more, so it costs O(N) in the
    gradient size S, against the ring allreduce's 2(N-1)/N·S per rank.
    """

    traits = Traits(family=ROOT, messages=PER_TENSOR,
                    no_compression_because="rank 0 averages the gathered gradients itself, so there is no sum across "
                                           "ranks to compress")

    def sync(self, model: nn.Module) -> None:
        world = dist.get_world_size()
        root = dist.get_rank() == 0
        for index, grad in enumerate(gradients(model)):
            nbytes = grad.numel() * grad.element_size()
            received = [torch.empty_like(grad) for _ in range(world)] if root else None
            timed(self._recorder, "gather", nbytes, dist.gather, grad, gather_list=received, dst=0, bucket=index)
            mean = torch.stack(received).mean(dim=0) if root else None
            timed(self._recorder, "scatter", nbytes, dist.scatter, grad, scatter_list=[mean] * world if root else None,
                  src=0, bucket=index)
