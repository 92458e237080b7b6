"""What a step's forward and backward compute in, by Lightning's names: 32-true (float32 throughout), bf16-mixed
(autocast to bfloat16; weights, gradients and optimizer state stay float32) and 16-mixed (autocast to float16, with
a loss scale that keeps small gradients from flushing to zero). auto picks bf16-mixed on a CUDA device that has it,
32-true elsewhere.

Forward and loss run under torch.autocast, backward outside it (autocast records the casts in the graph, and
backward runs each op in the dtype its forward ran in). Under 16-mixed the loss is multiplied by the scale before
backward, and the gradients are divided by it after the sync method has summed them (a sum of scaled gradients is
the scaled sum: the scale is a power of two, so nothing rounds differently), on the tensors the optimizer steps
(step/gradients.py). A step whose gradients hold an inf or a NaN on any rank is skipped on every rank, and the scale
halves; after 2000 clean steps in a row it doubles (torch's GradScaler's rule and defaults).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError

PRECISION_AUTO = "auto"
# the CPU flags (/proc/cpuinfo) of units that compute each autocast dtype: without one, oneDNN falls back to slow paths
CPU_UNITS = {torch.float16: ("avx512_fp16", "amx_fp16"), torch.bfloat16: ("avx512_bf16", "amx_bf16")}
# what a bench JSON or an advice that names no precision measured under: benches without one had no autocast
UNNAMED_PRECISION = "32-true"


@dataclass(frozen=True)
class Precision:
    name: str
    autocast_dtype: torch.dtype | None  # what autocast casts matmuls and convolutions to; None: no autocast
    scaled: bool = False  # float16: the loss is scaled before backward, the gradients unscaled after the sync
    peak: str | None = None  # the column of the device's peak FLOP/s it runs at (throughput.py); None: fp32/tf32

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """Around forward and loss: autocast to this precision's dtype on `device`'s kind, or nothing."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast_dtype)


PRECISIONS = {
    "32-true": Precision("32-true", None),
    "bf16-mixed": Precision("bf16-mixed", torch.bfloat16, peak="bf16"),
    "16-mixed": Precision("16-mixed", torch.float16, scaled=True, peak="fp16"),
}


def autocast_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch.autocast casts to `dtype` on `device`'s kind: asked of autocast itself, which on a kind and
    dtype it cannot run warns and turns itself off."""
    if not torch.amp.is_autocast_available(device.type):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warning says what the answer below says
        with torch.autocast(device.type, dtype=dtype):
            return torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) == dtype


def cuda_bf16(device: torch.device) -> bool:
    """A CUDA device that computes bfloat16 natively (compute capability 8.0, Ampere, or later): torch would emulate
    it on older ones, far slower than float32."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve(name: str, device: torch.device) -> Precision:
    """The precision --precision `name` runs at on `device` (auto: bf16-mixed on a CUDA device with bfloat16,
    32-true elsewhere); a mixed precision the device cannot compute in is refused."""
    if name == PRECISION_AUTO:
        return PRECISIONS["bf16-mixed" if cuda_bf16(device) else "32-true"]
    precision = PRECISIONS[name]
    dtype = precision.autocast_dtype
    if dtype is None:
        return precision
    if device.type == "cuda" and dtype == torch.bfloat16 and not cuda_bf16(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise UserError(f"--precision bf16-mixed computes in bfloat16, which {torch.cuda.get_device_name(device)} "
                        f"(compute capability {major}.{minor}) has no native support for: it needs compute capability "
                        f"8.0 (Ampere) or later. Use --precision 16-mixed (float16 with a loss scale), 32-true, or "
                        f"auto, which picks 32-true there.")
    if not autocast_runs(device, dtype):
        raise UserError(f"--precision {name} autocasts to {str(dtype).removeprefix('torch.')}, which torch "
                        f"{torch.__version__} cannot do on {device.type} devices. Use --precision 32-true, or auto.")
    return precision


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The instruction-set flags of this machine's CPUs, or None where the kernel does not say."""
    try:
        line = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return None
    return frozenset(line.partition(":")[2].split())


def slow_on_cpu(precision: Precision, device: torch.device, flags: frozenset[str] | None = None) -> str | None:
    """A sentence for a mixed precision this CPU has no arithmetic for, else None: autocast runs there on torch's
    slow paths (float16: about 10x float32's step for the MNIST CNN; docs/results.md), which no one picks knowingly."""
    if device.type != "cpu" or precision.autocast_dtype is None:
        return None
    flags = cpu_flags() if flags is None else flags
    units = CPU_UNITS[precision.autocast_dtype]
    if flags is None or any(unit in flags for unit in units):
        return None
    kind = str(precision.autocast_dtype).removeprefix("torch.")
    faster = next((f"bf16-mixed (this CPU has {unit})" for unit in CPU_UNITS[torch.bfloat16] if unit in flags),
                  "32-true")
    measured = " (8.8x to 10.6x its step for the MNIST CNN on such a CPU)" if precision.scaled else ""
    return (f"--precision {precision.name} on a CPU without {kind} arithmetic (it has neither {' nor '.join(units)}): "
            f"autocast takes torch's slow paths, slower than 32-true{measured}. {faster} trains faster here.")


def agreed(name: str, device: torch.device, cluster) -> Precision:
    """Collective: `resolve` on every rank, a refusal on any (a host of older GPUs) stopping every rank alike."""
    precision, refused = None, None
    try:
        precision = resolve(name, device)
    except UserError as error:
        refused = str(error)
    cluster.agree(refused, "the job cannot run at this precision")
    return precision


class LossScaler:
    """float16's dynamic loss scale, as torch's GradScaler keeps it (its kernels, its defaults): the loss times
    `scale` before backward, the gradients divided by it after the sync, checked for inf and NaN in the same pass.
    The ranks agree on each step's verdict (step/gradients.py), so every rank holds the same scale and count."""

    def __init__(self, device: torch.device, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        self.scale = torch.full((1,), init_scale, dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros(1, dtype=torch.int32, device=device)  # clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.skipped_steps = 0  # steps skipped in the whole job, resumed ones included

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def unscale_(self, gradients: list[torch.Tensor]) -> torch.Tensor:
        """Divide `gradients` by the scale in place; 1.0 when any holds an inf or a NaN, else 0.0 (a tensor on the
        scale's device: no wait)."""
        found = torch.zeros(1, dtype=torch.float32, device=self.scale.device)
        inverse = self.scale.double().reciprocal().float()  # as GradScaler: exact for a power of two
        by_kind: dict[tuple, list[torch.Tensor]] = {}
        for gradient in gradients:  # its kernel takes one device and dtype per call
            by_kind.setdefault((gradient.device, gradient.dtype), []).append(gradient)
        for group in by_kind.values():
            torch._amp_foreach_non_finite_check_and_unscale_(group, found, inverse.to(group[0].device))
        return found

    def update(self, found: torch.Tensor, skipped: bool) -> None:
        """After the step's verdict (`found`: the ranks' agreed overflow flag): back off on an overflow, grow after
        `growth_interval` clean steps."""
        torch._amp_update_scale_(self.scale, self.growth_tracker, found, self.growth_factor, self.backoff_factor,
                                 self.growth_interval)
        self.skipped_steps += int(skipped)

    def state_dict(self) -> dict:
        return {"scale": float(self.scale.item()), "growth_tracker": int(self.growth_tracker.item()),
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale.fill_(state["scale"])
        self.growth_tracker.fill_(state["growth_tracker"])
        self.skipped_steps = int(state["skipped_steps"])
