"""The interface every gradient compressor implements, whatever schedule carries its bytes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn


class Compressor:
    """How one bucket of gradients travels: the tensors summed across ranks, and how the mean comes back.

    A schedule (allreduce, flat, bucketed, ring, hierarchical) owns *how* a tensor is
    summed across ranks; a compressor owns *what* is summed. `rounds` is a generator:
    each value it yields is a tensor the schedule must replace by its sum over ranks
    (in place) before asking for the next one; when it ends, `data` holds the mean
    gradient. Elementwise casts need one round, PowerSGD two (P, then Q). Every rank
    yields the same sequence of shapes, so the schedule's collectives match.
    """

    name = "none"
    wire_dtype: torch.dtype | None = None  # what the summed tensors carry, when not the gradients' own dtype
    rounds_per_step = 1  # sums per bucket once it compresses: each pays the collective's latency (cost model)
    tunables: tuple[str, ...] = ()  # the TrainConfig fields (flags) from_config reads

    @classmethod
    def from_config(cls, config) -> Compressor:
        """The compressor as the job configures it (one with options reads its flags here)."""
        return cls()

    def rounds(self, params: Sequence[nn.Parameter], data: torch.Tensor, views: Sequence[torch.Tensor],
               world: int) -> Iterator[torch.Tensor]:
        """Average `data` (the bucket's gradients; `views` are its slices shaped like `params`) over `world` ranks."""
        yield data
        data.div_(world)

    def wire_bytes(self, params: Sequence[nn.Parameter]) -> float:
        """Bytes summed across ranks per step for these parameters' gradients: S of the cost model."""
        return float(sum(p.numel() * (self.wire_dtype or p.dtype).itemsize for p in params))

    def later_share(self, params: Sequence[nn.Parameter]) -> float:
        """The share of wire_bytes summed after the first round (PowerSGD's Qs): those rounds wait for the first
        round's sum, so a schedule that sends the first during backward may send them only later (cost model)."""
        return 0.0

    def state_dict(self, position: dict[int, int]) -> dict:
        """What this rank carries from step to step, for a checkpoint (tensors and plain data); `position` maps
        id(parameter) to its place among the model's parameters, the key a resumed job finds it by. None here."""
        return {}

    def load_state_dict(self, state: dict, params: Sequence[nn.Parameter]) -> None:
        """Take back what state_dict gave; `params` are the resumed job's parameters, in the same places."""


class Cast(Compressor):
    """Each rank's share of the mean, rounded once to a narrower float type and summed in it.

    As in PyTorch's fp16 compression hook, each rank divides by N before the cast, so the
    sum cannot overflow unless one rank's gradient already does. The buffer of the narrow
    type is allocated once per bucket and reused.
    """

    def __init__(self):
        self.shares: dict[tuple, torch.Tensor] = {}

    def rounds(self, params, data, views, world):
        key = tuple(params)
        shares = self.shares.get(key)
        if shares is None or shares.shape != data.shape:
            shares = self.shares[key] = torch.empty_like(data, dtype=self.wire_dtype)
        torch.div(data, world, out=shares)  # each rank's share of the mean, rounded once
        yield shares
        data.copy_(shares)
