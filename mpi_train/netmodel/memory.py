"""Memory per rank as the model predicts it: what a method keeps of the parameters, gradients and optimizer state.

From the model alone: P bytes of parameters, G of gradients (the trainable parameters'), O of
optimizer state (SGD keeps one momentum buffer per trainable parameter, O = G, and none without
momentum; AdamW two moments, O = 2G: optimizers.state_slots). A method says what it keeps only 1/N
of on each rank (its traits' `shards`, sync/traits.py):

    nothing (replicated)                P      + G      + O
    optimizer state (ZeRO-1)            P      + G      + O/N
    gradients and optimizer state       P      + G/N    + O/N      (+ padding: each bucket cut into N
      (ZeRO-2)                                                       equal shards, at most N-1 elements more;
                                                                     + P/N where the method steps a shard of
                                                                     its own, `keeps_parameter_shard`: zero)
    everything (ZeRO-3, FSDP)           P/N + U + G/N   + O/N      (U: one unit's gathered parameters,
                                                                     half-size under fsdp's mixed precision)

U is the largest unit's parameters, gathered whole around its forward and backward. Which modules
form a unit is the method's choice; the model takes each module that holds parameters of its own
(a convolution, a linear layer, a norm) as a unit, so U is the largest such module's bytes: the
smallest a unit can be, and the peak's lower bound when a method wraps bigger blocks. Shards of
ZeRO-3 are per tensor, by rows (FSDP2 shards dim 0, padded to a multiple of N rows); the others'
per bucket, by elements.
This is what a rank holds between steps, the measured figures' counterpart (mpi_train/memory.py),
except U, which exists only while a unit computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from ..sync.messages import BUCKETS, message_groups
from ..sync.traits import EVERYTHING, GRADIENTS_AND_STATE, OPTIMIZER_STATE, REPLICATED
from .prediction import gathered_share

SHARDED = {  # what each `shards` value keeps 1/N of
    REPLICATED: (), OPTIMIZER_STATE: ("optimizer",), GRADIENTS_AND_STATE: ("gradients", "optimizer"),
    EVERYTHING: ("parameters", "gradients", "optimizer"),
}


@dataclass(frozen=True)
class MemoryPrediction:
    """Bytes one rank holds, by kind, as the model predicts them; `gathered` is ZeRO-3's unit (U), counted in total."""

    parameters: float
    gradients: float
    optimizer: float
    gathered: float = 0.0

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.gathered

    def as_dict(self) -> dict:
        """Under the measured figures' names (memory.held_bytes): parameters_bytes, ..., total_bytes."""
        return {"parameters_bytes": self.parameters, "gradients_bytes": self.gradients,
                "optimizer_bytes": self.optimizer, "gathered_bytes": self.gathered, "total_bytes": self.total}


def largest_unit_bytes(model: nn.Module) -> int:
    """Bytes of the largest module's own parameters (not its children's): the model's unit of ZeRO-3's gathers."""
    return max((sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
                for module in model.modules()), default=0)


def shard_bytes(element_counts: list[int], item_size: int, world: int) -> int:
    """Bytes of one rank's shard when each group of `element_counts` elements is cut into N equal pieces (the
    last padded): sum of ceil(n/N) elements."""
    return sum(math.ceil(count / world) for count in element_counts) * item_size


def predict_memory(method, model: nn.Module, world: int, state_slots: int) -> MemoryPrediction:
    """Bytes per rank of `method` (a SyncMethod class or instance) training `model` on `world` ranks with an
    optimizer that keeps `state_slots` tensors the size of each parameter (optimizers.state_slots: SGD 1, or 0
    without momentum; AdamW 2); a method's `shards` decides what is divided by N."""
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    item = trainable[0].element_size() if trainable else 4
    full = {"parameters": sum(p.numel() * p.element_size() for p in params),
            "gradients": sum(p.numel() * p.element_size() for p in trainable)}
    full["optimizer"] = state_slots * full["gradients"]
    traits = method.traits
    sharded = SHARDED[traits.shards]
    if traits.shards == EVERYTHING:  # per tensor, by rows (FSDP2's Shard(0), padded)
        groups = [[math.ceil(p.shape[0] / world) * world * (p.numel() // p.shape[0]) if p.dim() else world]
                  for p in trainable]
    elif traits.messages == BUCKETS:  # per bucket, as the method cuts them
        sizes = [p.numel() * p.element_size() for p in trainable]
        groups = [[sum(trainable[i].numel() for i in group)]
                  for group in message_groups(sizes, BUCKETS, traits.bucket_caps)]
    else:  # one flat buffer
        groups = [[sum(p.numel() for p in trainable)]]
    per_rank = shard_bytes([sum(g) for g in groups], item, world)
    figures = {}
    for kind, whole in full.items():
        if kind not in sharded or world == 1:
            figures[kind] = float(whole)
        elif kind == "optimizer":
            figures[kind] = float(state_slots * per_rank)
        elif kind == "parameters":  # frozen parameters stay whole
            figures[kind] = float(per_rank + whole - full["gradients"])
        else:
            figures[kind] = float(per_rank)
    if traits.keeps_parameter_shard and world > 1:  # its own shard, stepped apart, then gathered
        figures["parameters"] += float(per_rank)
    # gathered in the dtype the method's all-gathers carry (fsdp under a mixed precision: half-size copies)
    gathered = (float(largest_unit_bytes(model)) * gathered_share(method)
                if "parameters" in sharded and world > 1 else 0.0)
    return MemoryPrediction(figures["parameters"], figures["gradients"], figures["optimizer"], gathered)
