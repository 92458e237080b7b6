"""The registry of gradient-sync methods, keyed by their --sync names.

Adding a method: one file in this folder with a SyncMethod subclass, one entry below.
"""

from __future__ import annotations

from .allreduce import AllReduce
from .base import SyncMethod
from .bucketed import Bucketed
from .ddp import DDP
from .flat import Flat
from .flat_fp16 import FlatFP16
from .gather_scatter import GatherScatter
from .ring import Ring

SYNC_METHODS: dict[str, type[SyncMethod]] = {
    "gather_scatter": GatherScatter,
    "allreduce": AllReduce,
    "ddp": DDP,
    "flat": Flat,
    "bucketed": Bucketed,
    "ring": Ring,
    "flat_fp16": FlatFP16,
}

__all__ = ["SYNC_METHODS", "SyncMethod"]
