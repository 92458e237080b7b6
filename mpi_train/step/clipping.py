"""--clip-grad-norm MAX: the gradient the optimizer applies scaled down to norm MAX where its norm is larger, as
torch.nn.utils.clip_grad_norm_ does (its kernels, its 1e-6), with the norm computed once, from what the optimizer
steps. Where every rank holds the whole averaged gradient, its norm needs no message; where each holds a shard
(zero, fsdp), the shards' squared norms are summed across ranks, as torch's FSDP clips (step/gradients.py sends that
sum with the step's other figure, in one all-reduce).

The norm is accumulated in float64: a float32 sum of squares over a million numbers on a CPU is off by about 1e-4
relative, and differently for each way of cutting the gradient into shards, which would make the norm (and so the
clipped update) depend on the method; in float64 it is the same under every method to far below float32's rounding.
"""

from __future__ import annotations

import torch

EPSILON = 1e-6  # clip_grad_norm_'s: MAX / (norm + EPSILON), so a zero gradient divides by no zero


def local_norm(gradients: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The 2-norm of these tensors together, a 0-d float64 tensor on `device` (zero for none), without a wait."""
    if not gradients:
        return torch.zeros((), dtype=torch.float64, device=device)
    norms = torch._foreach_norm(gradients, 2, dtype=torch.float64)
    return torch.linalg.vector_norm(torch.stack([norm.to(device) for norm in norms]), 2)


def clip_(gradients: list[torch.Tensor], norm: torch.Tensor, max_norm: float) -> None:
    """Scale `gradients` in place by min(1, max_norm / (norm + EPSILON)): the factor stays on the device, so the
    host waits for nothing (a factor of 1 multiplies by 1)."""
    if not gradients:
        return
    factor = torch.clamp(max_norm / (norm + EPSILON), max=1.0)
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for gradient in gradients:  # its kernel takes one device and dtype per call
        by_kind.setdefault((gradient.device, gradient.dtype), []).append(gradient)
    for (device, dtype), group in by_kind.items():
        torch._foreach_mul_(group, factor.to(device, dtype))
