"""diloco: each rank takes --period inner steps, then one outer Nesterov step on the ranks' mean change."""

from __future__ import annotations

from typing import ClassVar

import torch

from .averaging import ModelAveraging, averaging_options
from .base import AccuracyCost

DEFAULT_OUTER_LR = 0.7  # the paper's, with Nesterov momentum 0.9
DEFAULT_OUTER_MOMENTUM = 0.9
RESULTS = "docs/results.md#what-each-lossy-option-costs-in-accuracy"  # its accuracy, measured


class DiLoCo(ModelAveraging):
    """DiLoCo (Douillard et al.: "DiLoCo: Distributed Low-Communication Training of Language Models", 2023).

    The job's optimizer is the inner one. Every --period H steps the ranks average their change since the last
    outer step; its negative is the outer gradient, and the anchor (the model every rank restarts from) takes one
    step of SGD with Nesterov momentum on it (--outer-lr, --outer-momentum). The outer state (anchor, momentum) is
    computed from the same average on every rank, so it is identical everywhere, which the replica check confirms.
    With --outer-lr 1 --outer-momentum 0 it is local SGD, bit for bit.
    """

    tunables = (*ModelAveraging.tunables, "outer_lr", "outer_momentum")
    accuracy_costs: ClassVar[dict[tuple[str, str], AccuracyCost]] = {
        ("vgg11", "none"): AccuracyCost(-14.57, "diloco --period 8 (outer 0.7, Nesterov 0.9), CIFAR-10, one epoch, "
                                                "2 hosts x 2 ranks", RESULTS),
    }

    def __init__(self, compressor=None, outer_lr: float = DEFAULT_OUTER_LR,
                 outer_momentum: float = DEFAULT_OUTER_MOMENTUM, **averaging):
        super().__init__(compressor, **averaging)
        if outer_lr <= 0 or not 0 <= outer_momentum < 1:
            raise ValueError(f"diloco: outer lr {outer_lr}, outer momentum {outer_momentum}")
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.velocity: torch.Tensor | None = None  # the outer momentum buffer, flat like the anchor

    @classmethod
    def from_config(cls, config) -> DiLoCo:
        return cls(cls.compressor_from_config(config),
                   DEFAULT_OUTER_LR if config.outer_lr is None else config.outer_lr,
                   DEFAULT_OUTER_MOMENTUM if config.outer_momentum is None else config.outer_momentum,
                   **averaging_options(config))

    def step_anchor(self, mean_change: torch.Tensor, where: slice = slice(None)) -> None:
        """torch.optim.SGD(nesterov=True)'s update with the outer gradient -mean_change, on the elements `where` (a
        fragment's: its velocity is its own)."""
        gradient = mean_change.neg_()
        velocity = self.outer_state()[0][where]
        velocity.mul_(self.outer_momentum).add_(gradient)
        self.anchor[where].sub_(gradient.add_(velocity, alpha=self.outer_momentum), alpha=self.outer_lr)

    def outer_state(self) -> list[torch.Tensor]:
        if self.anchor is None:
            return []
        if self.velocity is None:
            self.velocity = torch.zeros_like(self.anchor)
        return [self.velocity]
