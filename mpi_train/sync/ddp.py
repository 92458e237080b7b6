"""ddp: PyTorch's DistributedDataParallel, which averages bucketed gradients during backward."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .base import INSIDE_DDP, SyncMethod
from .messages import BUCKETS


class DDP(SyncMethod):
    """The reference: communication overlaps backward, so its cost shows in compute time, not sync time.

    Subclasses compress the way DDP users do, with one of torch's communication hooks
    (`register_hook`), and name that compression as `fixed_compression`.
    """

    collective = "ring"
    messages = BUCKETS  # DDP's own: 1 MB first, then 25 MB (base.bucket_caps)
    sends = INSIDE_DDP
    no_compression_because = ("DistributedDataParallel compresses through torch's communication hooks: "
                              "use --sync ddp_fp16 or --sync ddp_powersgd")

    def wrap(self, model: nn.Module) -> nn.Module:
        device = next(model.parameters()).device
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.register_hook(wrapped)
        return wrapped

    def register_hook(self, wrapped: DistributedDataParallel) -> None:
        """Plain DDP: its built-in allreduce."""

    def sync(self, model: nn.Module) -> None:
        """Nothing left to do: the wrapper already averaged the gradients inside backward."""
