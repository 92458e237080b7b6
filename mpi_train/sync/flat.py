"""flat: copy every gradient into one persistent buffer, one all_reduce(SUM), divide, hand back views."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .base import EVERY_COMPRESSION, SyncMethod, sum_each_round
from .traits import RING_ALLREDUCE, Traits


def padded_length(count: int, multiple_of: int) -> int:
    """`count` rounded up to a multiple of `multiple_of`: 785 numbers in 3 equal shards take 786, 262 each."""
    return -(-count // multiple_of) * multiple_of


class FlatBuffer:
    """One contiguous buffer with a fixed slot for each parameter, allocated once and reused every step."""

    def __init__(self, params: list[nn.Parameter], multiple_of: int = 1):
        if len({(p.dtype, p.device) for p in params}) > 1:
            raise ValueError("a flat gradient buffer needs every parameter on one device with one dtype")
        self.params = params
        # zeros after the last slot up to a multiple of `multiple_of`: a buffer cut into N equal shards (zero.py)
        self.data = torch.zeros(padded_length(sum(p.numel() for p in params), multiple_of), dtype=params[0].dtype,
                                device=params[0].device)
        self.views, offset = [], 0
        for p in params:
            self.views.append(self.data[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def pack(self) -> None:
        """Copy each .grad into its slot; a parameter without a gradient contributes zeros."""
        for p, view in zip(self.params, self.views):
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)

    def unpack(self) -> None:
        """Point each .grad at its slot of the reduced buffer (no copy back); absent gradients stay absent."""
        for p, view in zip(self.params, self.views):
            if p.grad is not None:
                p.grad = view


class Flat(SyncMethod):
    """One allreduce for the whole model instead of one per layer.

    Per-layer allreduce pays the collective's fixed latency once per tensor (VGG-11:
    ~40 calls per step); coalescing pays it once and sends the same 2(N-1)/N·S bytes
    per rank, at the price of one memory copy of the gradients into the buffer. The
    reduced gradients are handed back as views of the buffer, so there is no copy out.
    Subclasses change how the buffer is summed (`allreduce_sum`, as `ring` and
    `hierarchical`); the compressor decides what is summed (`flat_fp16` is flat + fp16).
    """

    # one allreduce of all the bytes; Gloo and NCCL run it bandwidth-optimally
    traits = Traits(family=RING_ALLREDUCE, compressions=EVERY_COMPRESSION)
    message_name = "allreduce"  # its sum, as a timeline names it

    def __init__(self, compressor=None):
        super().__init__(compressor)
        self.buffer: FlatBuffer | None = None

    def sync(self, model: nn.Module) -> None:
        if self.buffer is None:
            self.buffer = FlatBuffer([p for p in model.parameters() if p.requires_grad])
        self.buffer.pack()
        sum_each_round(self.compressor.rounds(self.buffer.params, self.buffer.data, self.buffer.views,
                                              dist.get_world_size()),
                       self.allreduce_sum, self._recorder, self.message_name)
        self.buffer.unpack()

    def allreduce_sum(self, data: torch.Tensor) -> None:
        """Replace `data` on every rank by its elementwise sum over ranks."""
        dist.all_reduce(data, op=dist.ReduceOp.SUM)
