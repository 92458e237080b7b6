"""Object collectives over a torch store, for launchers without MPI (torchrun, srun).

Each collective writes under a fresh key (`mpi_train/objects/<n>/<rank>`); the store's
`get` waits for a key with the store's timeout, so a missing peer ends the wait.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .base import ObjectChannel

PREFIX = "mpi_train/objects"


class StoreChannel(ObjectChannel):
    """Values under keys of the store, encoded by wire.py: a value someone else set under a key is refused, and
    nothing of it runs."""

    def __init__(self, store: Any, rank: int, world_size: int):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.count = 0  # collectives so far: every rank calls them in the same order

    def _next(self) -> str:
        self.count += 1
        return f"{PREFIX}/{self.count}"

    def origin(self, collective: str, rank: int | None = None) -> str:
        key = f"{PREFIX}/{self.count}"
        if collective in ("allgather", "gather") or (collective == "scatter" and self.rank != 0):
            key += f"/{rank if rank is not None else self.rank}"
        return f"the store key {key!r} ({collective})"

    # The bytes pass through the store unread; the object methods (base.py) decode them, naming the key.
    def allgather_bytes(self, data: bytes) -> list[bytes]:
        key = self._next()
        self.store.set(f"{key}/{self.rank}", data)
        return [self.store.get(f"{key}/{rank}") for rank in range(self.world_size)]

    def bcast_bytes(self, data: bytes) -> bytes:
        key = self._next()
        if self.rank == 0:
            self.store.set(key, data)
            return data
        return self.store.get(key)

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        key = self._next()
        if self.rank != 0:
            self.store.set(f"{key}/{self.rank}", data)
            return None
        return [data] + [self.store.get(f"{key}/{rank}") for rank in range(1, self.world_size)]

    def scatter_bytes(self, parts: list[bytes] | None) -> bytes:
        key = self._next()
        if self.rank != 0:
            return self.store.get(f"{key}/{self.rank}")
        for rank in range(1, self.world_size):
            self.store.set(f"{key}/{rank}", parts[rank])
        return parts[0]

    def abort(self, code: int) -> None:
        """Exit now; the launcher (torchrun's agent, srun --kill-on-bad-exit) ends the other ranks."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
