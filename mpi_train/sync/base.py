"""The interface every gradient-sync method implements."""

from __future__ import annotations

from typing import Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .compression import COMPRESSORS, Compressor
from .compression.none import NoCompression

EVERY_COMPRESSION = tuple(COMPRESSORS)


def gradients(model: nn.Module) -> list[torch.Tensor]:
    """The .grad of every parameter that has one, in registration order (the same on every rank)."""
    return [p.grad for p in model.parameters() if p.grad is not None]


def sum_each_round(rounds: Iterator[torch.Tensor], allreduce_sum: Callable[[torch.Tensor], None]) -> None:
    """Drive a compressor's rounds to the end, summing each message across ranks before the next."""
    for message in rounds:
        allreduce_sum(message)


class SyncMethod:
    """Makes every rank's gradients equal to their mean across ranks, once per step.

    A method is a schedule (who sends what to whom, when) carrying a compressor (what
    the messages hold, see compression/). `compressions` lists the --compression values
    its schedule can carry; a name that stands for one schedule with one compression
    (`flat_fp16`) sets `fixed_compression`. `unsupported_backends` maps a backend to
    why the method cannot run there, so a job is refused before it starts.
    """

    cost_model: Optional[str] = None  # how it moves bytes: a key of mpi_train.costs.COST_MODELS ("ring", "root", ...)
    wire_dtype: Optional[torch.dtype] = None  # what its messages carry, when not the gradients' own dtype (compression)
    compressions: tuple[str, ...] = ("none",)
    fixed_compression: Optional[str] = None
    unsupported_backends: dict[str, str] = {}
    no_compression_because = "its schedule has no sum of gradients to compress"  # completes "cannot carry --compression X:"

    def __init__(self, compressor: Optional[Compressor] = None):
        self.compressor = compressor or NoCompression()
        if self.compressor.wire_dtype is not None:
            self.wire_dtype = self.compressor.wire_dtype

    @classmethod
    def from_config(cls, config) -> "SyncMethod":
        """The method as the training job configures it (methods with options read their flags here)."""
        return cls(cls.compressor_from_config(config))

    @classmethod
    def compression_name(cls, requested: str = "none") -> str:
        """The compression a job with --compression `requested` runs (a fixed one wins; the pair is checked up front)."""
        return cls.fixed_compression or requested

    @classmethod
    def compressor_from_config(cls, config) -> Compressor:
        return COMPRESSORS[cls.compression_name(getattr(config, "compression", "none"))].from_config(config)

    def wire_bytes(self, params: Sequence[nn.Parameter]) -> float:
        """S of the cost model: bytes each step's sums carry for these parameters, as this method sends them."""
        return self.compressor.wire_bytes([p for p in params if p.requires_grad])

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
