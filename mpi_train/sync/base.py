"""The interface every gradient-sync method implements."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn


def gradients(model: nn.Module) -> list[torch.Tensor]:
    """The .grad of every parameter that has one, in registration order (the same on every rank)."""
    return [p.grad for p in model.parameters() if p.grad is not None]


class SyncMethod:
    """Makes every rank's gradients equal to their mean across ranks, once per step."""

    cost_model: Optional[str] = None  # how it moves bytes: a key of mpi_train.costs.COST_MODELS ("ring", "root")
    wire_dtype: Optional[torch.dtype] = None  # what its messages carry, when not the gradients' own dtype (compression)

    @classmethod
    def from_config(cls, config) -> "SyncMethod":
        """The method as the training job configures it (methods with options read their flags here)."""
        return cls()

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module to run forward/backward on (a wrapper may hook into backward)."""
        return model

    def sync(self, model: nn.Module) -> None:
        """Called after backward, before the optimizer step: average the gradients."""
        raise NotImplementedError

    def sync_buffers(self, model: nn.Module) -> None:
        """Average floating-point buffers (BatchNorm running statistics) so evaluation sees one model."""
        world = dist.get_world_size()
        for buffer in model.buffers():
            if buffer.is_floating_point():
                dist.all_reduce(buffer)
                buffer.div_(world)
