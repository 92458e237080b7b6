"""fp16: each rank's share of the mean sent and summed as float16, half the bytes of float32."""

from __future__ import annotations

import torch

from .base import Cast


class FP16(Cast):
    """11 significant bits (relative rounding up to 2^-11 ≈ 5e-4 per share); shares of at most 2^-25 ≈ 2.98e-8 (half
    the smallest subnormal, 2^-24 ≈ 5.96e-8) become 0, sums above 65504 overflow: the range is float16's weakness,
    precision its strength over bfloat16."""

    name = "fp16"
    wire_dtype = torch.float16
