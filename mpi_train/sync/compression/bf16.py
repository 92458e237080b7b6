"""bf16: each rank's share of the mean sent and summed as bfloat16, half the bytes of float32."""

from __future__ import annotations

import torch

from .base import Cast


class BF16(Cast):
    """float32's exponent range (no overflow, no underflow to speak of), but only 8 significant bits:
    relative rounding up to 2^-8 ≈ 4e-3 per share, eight times float16's."""

    name = "bf16"
    wire_dtype = torch.bfloat16
