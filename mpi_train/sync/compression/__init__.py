"""The registry of gradient compressors, keyed by their --compression names.

A compressor decides what is summed across ranks; the sync method's schedule decides how
(see base.py). Adding one: a Compressor subclass in its own file here, one entry below.
"""

from __future__ import annotations

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

__all__ = ["COMPRESSORS", "Compressor"]
