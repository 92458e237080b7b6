"""none: the gradients travel as they are, and every rank gets their exact mean."""

from __future__ import annotations

from .base import Compressor


class NoCompression(Compressor):
    """One round: the bucket itself is summed, then divided by N (exact, to float32 rounding)."""
