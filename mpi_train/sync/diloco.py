"""diloco: each rank takes --period inner steps, then one outer Nesterov step on the ranks' mean change."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..errors import UserError
from .averaging import ModelAveraging, averaging_options
from .base import AccuracyCost, compressor_for
from .flag_fields import option, option_names

DEFAULT_OUTER_LR = 0.7  # the paper's, with Nesterov momentum 0.9
DEFAULT_OUTER_MOMENTUM = 0.9
RESULTS = "docs/results.md#what-each-lossy-option-costs-in-accuracy"  # its accuracy, measured


@dataclass(frozen=True)
class OuterStepOptions:
    """diloco's outer Nesterov step (TrainConfig composes it); None: the paper's value."""

    outer_lr: float | None = option(None, f"diloco: learning rate of the outer Nesterov step (default "
                                    f"{DEFAULT_OUTER_LR})")
    outer_momentum: float | None = option(None, f"diloco: momentum of the outer Nesterov step (default "
                                          f"{DEFAULT_OUTER_MOMENTUM})")

    def outer_step(self) -> tuple[float, float]:
        """The outer learning rate and momentum as the method runs them: given, or the paper's."""
        return (DEFAULT_OUTER_LR if self.outer_lr is None else self.outer_lr,
                DEFAULT_OUTER_MOMENTUM if self.outer_momentum is None else self.outer_momentum)

    def check_outer_step(self) -> None:
        """Refused before any work starts, like every flag a job cannot run."""
        if self.outer_lr is not None and self.outer_lr <= 0:
            raise UserError(f"--outer-lr must be positive, got {self.outer_lr}.")
        if self.outer_momentum is not None and not 0 <= self.outer_momentum < 1:
            raise UserError(f"--outer-momentum must be in [0, 1), got {self.outer_momentum}.")


class DiLoCo(ModelAveraging):
    """DiLoCo (Douillard et al.: "DiLoCo: Distributed Low-Communication Training of Language Models", 2023).

    The job's optimizer is the inner one. Every --period H steps the ranks average their change since the last
    outer step; its negative is the outer gradient, and the anchor (the model every rank restarts from) takes one
    step of SGD with Nesterov momentum on it (--outer-lr, --outer-momentum). The outer state (anchor, momentum) is
    computed from the same average on every rank, so it is identical everywhere, which the replica check confirms.
    With --outer-lr 1 --outer-momentum 0 it is local SGD, bit for bit.
    """

    traits = replace(
        ModelAveraging.traits, tunables=(*ModelAveraging.traits.tunables, *option_names(OuterStepOptions)),
        accuracy_costs={
            ("vgg11", "none"): AccuracyCost(-14.57, "diloco --period 8 (outer 0.7, Nesterov 0.9), CIFAR-10, one "
                                                    "epoch, 2 hosts x 2 ranks", RESULTS),
        })

    def __init__(self, compressor=None, outer_lr: float = DEFAULT_OUTER_LR,
                 outer_momentum: float = DEFAULT_OUTER_MOMENTUM, **averaging):
        super().__init__(compressor, **averaging)
        if outer_lr <= 0 or not 0 <= outer_momentum < 1:
            raise ValueError(f"diloco: outer lr {outer_lr}, outer momentum {outer_momentum}")
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.velocity: torch.Tensor | None = None  # the outer momentum buffer, flat like the anchor

    @classmethod
    def _from_config(cls, config) -> DiLoCo:
        return cls(compressor_for(cls, config), *config.outer_step(), **averaging_options(config))

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
