"""ddp: PyTorch's DistributedDataParallel, which averages bucketed gradients during backward."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .base import SyncMethod


class DDP(SyncMethod):
    """The reference: communication overlaps backward, so its cost shows in compute time, not sync time."""

    cost_model = "ring"

    def wrap(self, model: nn.Module) -> nn.Module:
        device = next(model.parameters()).device
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def sync(self, model: nn.Module) -> None:
        """Nothing left to do: the wrapper already averaged the gradients inside backward."""
