"""The registry of gradient compressors, keyed by their --compression names.

A compressor decides what is summed across ranks; the sync method's schedule decides how
(see base.py). Adding one: a Compressor subclass in its own file here, one entry below.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..flag_fields import option
from .base import Compressor
from .bf16 import BF16
from .fp16 import FP16
from .none import NoCompression
from .powersgd import PowerSGD

COMPRESSORS: dict[str, type[Compressor]] = {
    "none": NoCompression,
    "fp16": FP16,
    "bf16": BF16,
    "powersgd": PowerSGD,
}


@dataclass(frozen=True)
class CompressionChoice:
    """--compression, taken by the methods whose `compressions` list it (TrainConfig composes it)."""

    compression: str = option("none", "what the sync method's messages carry: none (float32), fp16 or bf16 (half the "
                              "bytes), powersgd (rank-r factors of each gradient matrix); taken by allreduce, flat, "
                              "bucketed, ring, hierarchical, localsgd and diloco, and by zero (fp16, bf16)",
                              choices="compression")


__all__ = ["COMPRESSORS", "CompressionChoice", "Compressor"]
