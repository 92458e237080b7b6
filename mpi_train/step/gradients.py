"""Between the sync and the optimizer step: the gradient the optimizer applies unscaled (16-mixed), checked for an
overflow that every rank then acts on alike, and clipped (--clip-grad-norm); each step's figures for the log.

It works on the tensors the optimizer steps, after the sync method is done with them: the whole averaged
gradients of a replicated method, this rank's shard under zero (its optimizer steps the shard) and fsdp (a DTensor's
local part), each rank's own gradients under model averaging. So one rule covers every method, those that send
during backward or inside DDP or FSDP included: they send the scaled gradients, and a sum of scaled gradients is the
scaled sum.

The ranks must skip the same steps: where gradients are sharded, or each rank steps its own (model averaging), an
overflow may show on one rank only. So under 16-mixed each step's overflow flag is summed across ranks, in one
all-reduce of a few bytes that also carries the squared norm of a sharded gradient when it is clipped; the host then
waits for the verdict, as torch's GradScaler waits before an optimizer step. A skipped step is a step in every count
but the update: its batch is used up, the learning rate schedule moves on (a pure function of the step number), a
model-averaging method's period counts it (its average, when due, averages models that did not move), and its
position is what a checkpoint records; only optimizer.step() is left out, so the weights and the optimizer's state
(momentum, AdamW's moments and step count) stay as they were.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..sync import SYNC_METHODS
from ..sync.base import EVERYTHING, GRADIENTS, GRADIENTS_AND_STATE, local_part
from .clipping import clip_, local_norm
from .precision import PRECISIONS, LossScaler, Precision

SHARDED_GRADIENTS = (GRADIENTS_AND_STATE, EVERYTHING)  # a method's `shards` under which its optimizer steps shards


def optimizer_gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The .grad of every tensor the optimizer steps, as plain tensors whose in-place changes it sees: a DTensor's
    (fsdp) local shard."""
    found = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                found.append(local_part(param.grad))
    return found


def scaled_compression_error(precision: str, sync: str, compression: str) -> str | None:
    """Why --precision `precision` cannot run --sync `sync` with --compression `compression`, or None. 16-mixed sends
    scaled gradients, and PowerSGD's error feedback keeps what a step did not deliver for the steps after it: a step
    whose gradients overflow would leave inf there, and every later step would be skipped. A method that averages
    models compresses their change, which the loss scale never touches."""
    method = SYNC_METHODS[sync]
    if not PRECISIONS.get(precision, PRECISIONS["32-true"]).scaled or method.traits.averages != GRADIENTS:
        return None
    if method.traits.compression_name(compression) != "powersgd":
        return None
    other = ("--sync ddp_fp16 (or ddp)" if method.traits.fixed_compression
             else "--compression fp16 or bf16 (which keep no memory)")
    return (f"--precision 16-mixed scales the loss, so the gradients that --sync {sync} compresses with PowerSGD "
            f"carry the scale, and PowerSGD's error feedback keeps what a step did not deliver for the next: one "
            f"step whose gradients overflow (what the loss scale exists to catch) would leave inf in it for good, and "
            f"every later step would be skipped. Use --precision bf16-mixed (no loss scale) with PowerSGD, or "
            f"{other}.")


class OptimizerGradients:
    """What the step does to the gradients between the sync and optimizer.step(), and what it logs of them."""

    def __init__(self, precision: Precision, method, optimizer: torch.optim.Optimizer, max_norm: float | None,
                 device: torch.device, world_size: int):
        self.scaler = LossScaler(device) if precision.scaled else None
        self.optimizer, self.max_norm, self.device, self.world_size = optimizer, max_norm, device, world_size
        self.sharded = method.traits.shards in SHARDED_GRADIENTS  # the norm is the shards' together
        self.norm: torch.Tensor | None = None  # the last step's norm before clipping (None: that step was skipped)

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """What backward starts from: the loss times the loss scale under 16-mixed, else the loss."""
        return self.scaler.scaled(loss) if self.scaler else loss

    def ready(self) -> bool:
        """After the sync: unscale, agree, clip. False when the step is skipped on every rank (an overflow on any).
        Collective under 16-mixed, and under --clip-grad-norm where the gradients are sharded."""
        if self.scaler is None and self.max_norm is None:
            return True
        gradients = optimizer_gradients(self.optimizer)
        found = self.scaler.unscale_(gradients) if self.scaler else None
        norm = local_norm(gradients, self.device) if self.max_norm is not None else None
        summed = [found] if found is not None else []  # what the ranks add up: the flag, a sharded norm's square
        if self.sharded and norm is not None:
            summed.append(norm.square().reshape(1))
        if summed and self.world_size > 1:
            together = torch.cat([part.double() for part in summed])
            dist.all_reduce(together)  # a sum: any rank's overflow makes the flag positive
            if found is not None:
                found = together[:1].clamp(max=1.0).float()
            if self.sharded and norm is not None:
                norm = together[-1].sqrt()
        if found is not None:
            skipped = bool(found.item())  # the host waits for the verdict, as GradScaler does
            self.scaler.update(found, skipped)
            if skipped:
                self.norm = None
                return False
        if norm is not None:
            clip_(gradients, norm, self.max_norm)
            self.norm = norm
        return True

    def figures(self) -> dict:
        """This rank's figures for a logged step: the gradient's norm before clipping (none on a skipped step),
        the loss scale the next step uses and the steps skipped so far."""
        figures = {}
        if self.norm is not None:
            figures["grad_norm"] = float(self.norm)
        if self.scaler is not None:
            figures["grad_scale"] = float(self.scaler.scale.item())
            figures["skipped_steps"] = self.scaler.skipped_steps
        return figures

    def state_dict(self) -> dict | None:
        """What a checkpoint keeps (the same on every rank): the loss scaler's state, or None without one."""
        return self.scaler.state_dict() if self.scaler else None

    def load_state_dict(self, state: dict | None) -> None:
        """A checkpoint's loss scaler state; a job without a scaler, or a checkpoint without one, starts afresh."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
