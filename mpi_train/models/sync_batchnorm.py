"""BatchNorm over the global batch (--sync-bn): every rank normalises with the statistics of all ranks' samples.

A plain BatchNorm layer normalises each rank's share of the global batch with that share's own
mean and variance, so the same global batch split 2 ways trains otherwise than split 3 ways:
a job that shrinks or grows (lab/supervise.py) or a run compared across rank counts drifts
apart for that alone. With --sync-bn each BatchNorm layer adds up its ranks' statistics in
forward (one allreduce of 2C+1 numbers per rank a layer, C its channels) and their gradients
in backward, so a step's loss and gradient depend on the global batch only, up to the order
of a sum, as one process on the whole batch would compute them.

torch's SyncBatchNorm does the same on GPUs only; this one runs on any device and backend.
Each rank's count, mean and sum of squared deviations are gathered (an allreduce of one row
per rank, the others zeros, exact) and combined in rank order with Chan's formula, which keeps
float32's precision where E[x^2] - E[x]^2 would not. In evaluation a layer uses its running
statistics, the same on every rank, as a plain BatchNorm does; the saved model's layers are
plain BatchNorm layers with the same state.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class GlobalBatchNorm(_BatchNorm):
    """A BatchNorm layer of any dimension whose training statistics are those of every rank's samples."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected an input of 2 or more dimensions (batch, channels, ...), got {input.dim()}")

    @torch.compiler.disable  # a collective in forward: the graph breaks around it rather than tracing it
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(input)
        channels = input.shape[1]
        reduced = [0, *range(2, input.dim())]
        values = input.float()  # statistics in float32 under any autocast, as BatchNorm keeps them
        count = values.numel() // channels
        variance, mean = torch.var_mean(values, dim=reduced, unbiased=False)
        mine = torch.cat([values.new_full((1,), float(count)), mean, variance * count])
        rank, world = dist.get_rank(), dist.get_world_size()
        rows = torch.stack([mine if other == rank else torch.zeros_like(mine) for other in range(world)])
        rows = dist_nn.all_reduce(rows)  # every rank's row; its backward adds up each row's gradient over the ranks
        counts, means, squares = rows[:, :1], rows[:, 1:channels + 1], rows[:, channels + 1:]
        total = counts.sum()
        global_mean = (counts * means).sum(0) / total
        global_var = (squares.sum(0) + (counts * (means - global_mean) ** 2).sum(0)) / total
        self._track(global_mean.detach(), global_var.detach(), total.detach())
        shape = (1, channels, *([1] * (input.dim() - 2)))
        out = (values - global_mean.view(shape)) * torch.rsqrt(global_var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)

    def _track(self, mean: torch.Tensor, variance: torch.Tensor, count: torch.Tensor) -> None:
        """The running statistics, updated as BatchNorm updates them (the variance unbiased over the global batch)."""
        if not self.track_running_stats:
            return
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
            unbiased = variance * count / (count - 1).clamp_min(1)  # on the device: no wait for it
            self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(module, _BatchNorm) for module in model.modules())


def globalise_batchnorm(model: nn.Module) -> int:
    """Turn every BatchNorm layer of `model` into a GlobalBatchNorm in place, keeping its parameters and buffers (so
    its state_dict's keys and values); the number of layers turned."""
    turned = 0
    for module in model.modules():
        if isinstance(module, _BatchNorm) and not isinstance(module, GlobalBatchNorm):
            module.__class__ = GlobalBatchNorm  # same attributes, same state: only forward changes
            turned += 1
    return turned
