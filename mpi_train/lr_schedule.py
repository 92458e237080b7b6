"""The learning rate at every step: linear warm-up, then constant, cosine or step decay; and each model's optimizer
and its defaults.

Early SGD steps on a freshly initialised network take large, badly aimed steps: with the
full learning rate from step 1, VGG-11's loss climbs far above ln 10 before it falls, and
the sync methods' loss curves then part for reasons that have nothing to do with the
methods. Warm-up ramps the rate from peak/W to peak over the first W steps; the decay then
brings it down over the rest of the run, which is what one short epoch needs to end well.

The schedule is a pure function of the step, so a resumed job continues it exactly without
storing anything. Its length is the whole run (--epochs times the steps of an epoch), not
--max-steps: a job cut short by --max-steps follows the same curve as the full one, and a
checkpoint taken part-way continues on it.

The course's plain settings (one fixed learning rate, no warm-up) are
`--lr-schedule constant --warmup-steps 0`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

LR_SCHEDULES = ("constant", "cosine", "step")
# --lr-schedule step: the rate is divided by 10 at these fractions of the steps after warm-up
STEP_DECAY_AT = (0.5, 0.75)
STEP_DECAY_FACTOR = 0.1


@dataclass(frozen=True)
class OptimizerDefaults:
    """What a model trains with when the command line does not say (chosen by experiments/lr_sweep.toml)."""

    optimizer: str  # a name in optimizers.OPTIMIZERS
    lr: float
    momentum: float | None  # SGD's; None for an optimizer that does not read it (AdamW: its betas)
    weight_decay: float
    warmup_steps: int


# Measured in docs/results.md ("Where the learning-rate defaults come from"): batch 256 on 4 ranks. vgg11: half
# the rate at which its loss spiked during warm-up (0.02-0.025); mnist_cnn: 0.1 reached in 40 steps, 98.07-98.37% after
# one epoch for seeds 1, 2, 42 (20 warm-up steps: 97.93% at seed 42, its loss jumping back to 1.7 at step 12).
# Each model's first entry is its default optimizer; --optimizer picks another entry.
MODEL_DEFAULTS = {
    "vgg11": (OptimizerDefaults("sgd", lr=0.01, momentum=0.9, weight_decay=5e-4, warmup_steps=20),),
    "mnist_cnn": (OptimizerDefaults("sgd", lr=0.1, momentum=0.9, weight_decay=5e-4, warmup_steps=40),),
    "gpt": (OptimizerDefaults("adamw", lr=3e-3, momentum=None, weight_decay=0.0, warmup_steps=50),
            OptimizerDefaults("sgd", lr=0.1, momentum=0.9, weight_decay=0.0, warmup_steps=50)),
}
# gpt, AdamW: docs/results.md ("How fast gpt learns a real text file"); no weight decay, as with SGD: a run of
# minutes sees each byte of its text once or twice. gpt, SGD: 0.1 learned steadily where 0.3 oscillated and 0.45
# diverged, and it stalls at 2.4 nats per byte on real text.
# Any other model (torchvision's, the user's): vgg11's, the measured setting of the deepest built-in convnet. Not
# tuned for them: pass --lr and friends for a real comparison.
OTHER_MODELS = MODEL_DEFAULTS["vgg11"][0]
# An optimizer a model has no measured entry for: these, with the warm-up of the model's default optimizer.
# AdamW: torch's own rate and weight decay.
GENERAL = {"sgd": OTHER_MODELS,
           "adamw": OptimizerDefaults("adamw", lr=1e-3, momentum=None, weight_decay=0.01, warmup_steps=20)}


def optimizer_defaults(model: str, optimizer: str | None = None) -> OptimizerDefaults:
    """What `model` trains with when the command line does not say; `optimizer`: that one's (default: the model's)."""
    entries = MODEL_DEFAULTS.get(model, (OTHER_MODELS,))
    chosen = optimizer or entries[0].optimizer
    for entry in entries:
        if entry.optimizer == chosen:
            return entry
    return replace(GENERAL[chosen], warmup_steps=entries[0].warmup_steps)


def lr_factor(step: int, kind: str, warmup_steps: int, total_steps: int) -> float:
    """The multiple of the peak rate used by optimizer step `step` (1-based) of `total_steps`."""
    if warmup_steps and step <= warmup_steps:
        return step / warmup_steps
    if kind == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - 1 - warmup_steps) / decay_steps)  # 0 at the first step after warm-up
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if kind == "step":
        return STEP_DECAY_FACTOR ** sum(progress >= at for at in STEP_DECAY_AT)
    raise ValueError(f"unknown learning-rate schedule {kind!r}; choose one of {', '.join(LR_SCHEDULES)}")


class LearningRate:
    """Sets the optimizer's rate for the coming step; `step()` after each optimizer step moves it on."""

    def __init__(self, optimizer: torch.optim.Optimizer, peak: float, kind: str, warmup_steps: int,
                 total_steps: int, steps_done: int = 0):
        self.optimizer, self.peak, self.kind = optimizer, peak, kind
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self.steps_done = steps_done  # a resumed job starts where its checkpoint stopped
        self._apply()

    @property
    def current(self) -> float:
        """The rate the next (or the just-taken, before step()) optimizer step uses."""
        return self.peak * lr_factor(self.steps_done + 1, self.kind, self.warmup_steps, self.total_steps)

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.current

    def step(self) -> None:
        self.steps_done += 1
        self._apply()
