"""What a step achieves: samples per second per rank and per job, the data phase's share of the step, and the
model's FLOP/s, against the device's peak where the device is known (MFU, as nanoGPT and torchtitan report it): the
peak of the precision the step's matmuls and convolutions run in (bf16 or fp16 under a mixed precision, tf32 or fp32
under 32-true), so a bf16 job's MFU is not flattered by the lower tf32 peak.

The FLOPs of one sample's forward and backward are counted once per job by torch's own counter, on a copy of the
model built on the meta device (no memory, no compute, no random draws). Achieved FLOP/s is that count times the
samples a rank trains per second of whole step, sync and data included: what the device did of useful model work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .step.precision import PRECISIONS

# Dense peak FLOP/s per GPU from the vendors' data sheets (tensor cores for tf32, bf16 and fp16: half the sheets'
# "with sparsity" figures). Checked in order: a more specific name first (the NVL and PCIe parts run slower clocks).
PEAK_FLOPS = (
    ("H100 PCIe", {"fp32": 51.2e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12}),
    ("H100 NVL", {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12}),
    ("H200 NVL", {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12}),
    ("H100", {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}),
    ("H200", {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}),
    ("A100", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}),
)


def flops_per_sample(build, input_shape: tuple[int, ...], batch: int = 8, tokens: bool = False) -> float:
    """Forward and backward FLOPs of one sample through the model `build()` makes, with a cross-entropy loss.
    `tokens`: the sample is a sequence of input_shape[0] tokens with a target at each position (a language model).
    The counter counts every matmul, attention's included: for a GPT that is the 6N rule plus attention's
    12 x layers x context x width per token (tests/test_throughput.py checks the two agree)."""
    from torch.utils.flop_counter import FlopCounterMode  # here, not at the top: only a job's setup counts

    from .models import NEEDS_VALUES  # here, not at the top: the models import what imports this

    for device in ("meta", "cpu"):  # on the meta device nothing is computed; a forward whose path its values
        # decide (an `if` on a tensor) needs them, and is counted on a real copy
        with torch.random.fork_rng(devices=[]), torch.device(device):
            model = build()
            images = torch.zeros(batch, *input_shape, dtype=torch.int64 if tokens else None)
            labels = torch.zeros(batch * (input_shape[0] if tokens else 1), dtype=torch.int64)
        try:
            with FlopCounterMode(display=False) as counter:
                F.cross_entropy(model(images), labels).backward()
            return counter.get_total_flops() / batch
        except Exception as error:
            if device != "meta" or not NEEDS_VALUES.search(str(error)):
                raise
    raise AssertionError("not reached: the real copy's count returns or raises")


def compute_dtype(device: torch.device, precision: str = "32-true") -> str:
    """The peak column the model's matmuls and convolutions run at under `precision` (a resolved --precision):
    autocast's dtype under a mixed precision; under 32-true tf32 where torch lets cuDNN or cuBLAS use tensor cores
    (cuDNN's convolutions do by default), else fp32."""
    if PRECISIONS[precision].peak:
        return PRECISIONS[precision].peak
    if device.type == "cuda" and (torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32):
        return "tf32"
    return "fp32"


def peak_flops(device_name: str, dtype: str) -> float | None:
    """The device's dense peak for `dtype`, or None for a device not in the table (CPUs among them)."""
    for fragment, peaks in PEAK_FLOPS:
        if fragment in device_name:
            return peaks.get(dtype)
    return None


def flops(rate: float) -> str:
    """FLOP/s in the unit that reads best: 57.9 GFLOP/s on a CPU, 312 TFLOP/s on a GPU."""
    return f"{rate / 1e12:.3g} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:.3g} GFLOP/s"


@dataclass(frozen=True)
class Throughput:
    """One job's model cost and device: what turns step times into samples/s, FLOP/s and MFU."""

    flops_per_sample: float
    device_name: str
    dtype: str
    peak_flops: float | None
    tokens_per_sample: int = 0  # a language model's context (a sample is a sequence); 0: images

    @classmethod
    def of(cls, build, input_shape: tuple[int, ...], device: torch.device, tokens: bool = False,
           precision: str = "32-true") -> Throughput:
        """The model `build()` makes on `device`, its step computing in `precision` (resolved: not auto)."""
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        dtype = compute_dtype(device, precision)
        return cls(flops_per_sample(build, input_shape, tokens=tokens), name, dtype, peak_flops(name, dtype),
                   input_shape[0] if tokens else 0)

    def figures(self, times: dict, global_batch: int, world_size: int) -> dict:
        """A step's (or a run's mean) throughput from its phase times (means over ranks)."""
        step_s = times["step_time_s"]
        per_rank = global_batch / world_size / step_s if step_s else 0.0
        achieved = per_rank * self.flops_per_sample
        return {"samples_per_s_per_rank": per_rank, "data_share": times["data_time_s"] / step_s if step_s else 0.0,
                **({"tokens_per_s_per_rank": per_rank * self.tokens_per_sample} if self.tokens_per_sample else {}),
                "flops_per_s": achieved, **({"mfu": achieved / self.peak_flops} if self.peak_flops else {})}

    def describe(self, figures: dict) -> str:
        """The console's words for `figures`: per rank, FLOP/s and MFU where known."""
        rate = (f"{figures['tokens_per_s_per_rank']:,.0f} tokens/s/rank" if "tokens_per_s_per_rank" in figures
                else f"{figures['samples_per_s_per_rank']:,.0f}/rank")
        return (f"{rate}, data {100 * figures['data_share']:.0f}%, "
                f"{flops(figures['flops_per_s'])}/rank"
                + (f", MFU {100 * figures['mfu']:.1f}%" if "mfu" in figures else ""))

    def as_dict(self) -> dict:
        return {"flops_per_sample": self.flops_per_sample, "device_name": self.device_name, "dtype": self.dtype,
                "peak_flops": self.peak_flops,
                **({"tokens_per_sample": self.tokens_per_sample} if self.tokens_per_sample else {})}
