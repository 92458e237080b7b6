"""Object collectives over a torch store, for launchers without MPI (torchrun, srun).

Each collective writes under a fresh key (`mpi_train/objects/<n>/<rank>`); the store's
`get` waits for a key with the store's timeout, so a missing peer ends the wait.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any

from .base import ObjectChannel

PREFIX = "mpi_train/objects"


class StoreChannel(ObjectChannel):
    def __init__(self, store: Any, rank: int, world_size: int):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.count = 0  # collectives so far: every rank calls them in the same order

    def _next(self) -> str:
        self.count += 1
        return f"{PREFIX}/{self.count}"

    def _put(self, key: str, value: Any) -> None:
        self.store.set(key, pickle.dumps(value))

    def _take(self, key: str) -> Any:
        return pickle.loads(self.store.get(key))

    def allgather(self, value: Any) -> list:
        key = self._next()
        self._put(f"{key}/{self.rank}", value)
        return [self._take(f"{key}/{rank}") for rank in range(self.world_size)]

    def bcast(self, value: Any) -> Any:
        key = self._next()
        if self.rank == 0:
            self._put(key, value)
            return value
        return self._take(key)

    def gather(self, value: Any) -> list | None:
        key = self._next()
        if self.rank != 0:
            self._put(f"{key}/{self.rank}", value)
            return None
        return [value] + [self._take(f"{key}/{rank}") for rank in range(1, self.world_size)]

    def scatter(self, values: list | None) -> Any:
        key = self._next()
        if self.rank != 0:
            return self._take(f"{key}/{self.rank}")
        for rank in range(1, self.world_size):
            self._put(f"{key}/{rank}", values[rank])
        return values[0]

    def abort(self, code: int) -> None:
        """Exit now; the launcher (torchrun's agent, srun --kill-on-bad-exit) ends the other ranks."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
