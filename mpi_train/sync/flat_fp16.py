"""flat_fp16: `flat` with the gradients sent as float16; the name kept for `--sync flat --compression fp16`."""

from __future__ import annotations

from dataclasses import replace

import torch

from .flat import Flat


class FlatFP16(Flat):
    """Gradient compression on the flat schedule: one allreduce of the whole gradient buffer, in float16.

    The same as `--sync flat --compression fp16` (see compression/fp16.py); kept as a
    name of its own so that runs, experiment files and results that use it stay valid.
    """

    traits = replace(Flat.traits, fixed_compression="fp16", wire_dtype=torch.float16)
