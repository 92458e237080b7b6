"""The optimizers a job can step with (--optimizer), keyed by their command-line names.

SGD with momentum is what the image models train with: one state tensor per parameter, its momentum
buffer. AdamW (Adam with decoupled weight decay) divides each element's step by a running estimate of
that element's gradient size: a transformer's embedding and its blocks' matrices get gradients whose
scales differ by orders of magnitude, which one SGD rate serves badly (docs/results.md, "How fast
gpt learns a real text file"). It keeps two state tensors per parameter (the first and second moments) and
a step count. Both update each element from that element's own gradient and state, so a method that
shards the optimizer state (zero, zero_torch, fsdp) steps exactly what one optimizer over the whole
model would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # for the annotations only: lr_schedule's defaults name these optimizers
    from .lr_schedule import OptimizerDefaults

ADAMW_BETAS = (0.9, 0.95)  # nanoGPT's: a shorter memory of the gradient's size than torch's default 0.999


class Sgd:
    """torch.optim.SGD with --momentum and --weight-decay (coupled: added to the gradient)."""

    name = "sgd"
    reads_momentum = True  # --momentum means something to it
    moments = ("momentum_buffer",)  # per-parameter state that --local-momentum averages or resets

    @staticmethod
    def build(params: Iterable[torch.Tensor], settings: OptimizerDefaults) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum or 0.0,
                               weight_decay=settings.weight_decay)

    @staticmethod
    def state_slots(momentum: float | None) -> int:
        """Tensors of state kept per trainable parameter, each its size: the momentum buffer, or none."""
        return 1 if momentum else 0


class AdamW:
    """torch.optim.AdamW with betas (0.9, 0.95) and --weight-decay (decoupled: the weights shrink by lr * wd)."""

    name = "adamw"
    reads_momentum = False  # its betas play momentum's part; --momentum is refused rather than ignored
    moments = ("exp_avg", "exp_avg_sq")

    @staticmethod
    def build(params: Iterable[torch.Tensor], settings: OptimizerDefaults) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=settings.lr, betas=ADAMW_BETAS, weight_decay=settings.weight_decay)

    @staticmethod
    def state_slots(momentum: float | None) -> int:
        """The first and second moments (the step count, one number per parameter, is left out)."""
        return 2


OPTIMIZERS = {kind.name: kind for kind in (Sgd, AdamW)}
# What tells the optimizers' states apart where none is named (a checkpoint of an older version): the state each keeps
# per parameter, or a setting of its parameter groups only it has (SGD without momentum keeps no state at all).
TELLTALES = {Sgd.name: {*Sgd.moments, "nesterov"}, AdamW.name: {*AdamW.moments, "betas"}}


def told_by_state(state: dict) -> str | None:
    """The optimizer whose state_dict `state` is, told by its telltales; None when it cannot be told."""
    keys = {key for entry in (state.get("state") or {}).values() if isinstance(entry, dict) for key in entry}
    keys |= {key for group in state.get("param_groups") or () if isinstance(group, dict) for key in group}
    told = [name for name, telltale in TELLTALES.items() if keys & telltale]
    return told[0] if len(told) == 1 else None


def describe_state(optimizer: str, momentum: float | None) -> str:
    """The optimizer state a memory prediction assumes, in words: `SGD state at momentum 0.9`."""
    return f"SGD state at momentum {momentum:g}" if optimizer == Sgd.name else f"{optimizer} state (two moments)"


def state_slots(settings: OptimizerDefaults) -> int:
    """Tensors of optimizer state per trainable parameter, each the parameter's size (what memory predictions use)."""
    return OPTIMIZERS[settings.optimizer].state_slots(settings.momentum)
