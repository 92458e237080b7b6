"""Object collectives over a torch store, for launchers without MPI (torchrun, srun).

Each collective writes under a fresh key (`mpi_train/objects/<n>/<rank>`); the store's
`get` waits for a key with the store's timeout, so a missing peer ends the wait.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, TypeVar

from .base import ObjectChannel

PREFIX = "mpi_train/objects"
# what torch's C++ prints to the process's stderr when a store request fails: a warning, then a C++ stack
CPP_STACK_LINE = re.compile(r"^((\[rank\d+\]:)?\[[WE]\d.*\] \[c10d\]|Exception raised from |frame #\d+: "
                            r"|<omitting python frames>)")
T = TypeVar("T")


def asked(store: Any, request: Callable[[], T]) -> T | None:
    """`request()` of the store; None where its server is gone (rank 0's process, under mpirun) or goes meanwhile.
    Asked after another rank failed, when that rank may have been the server: a request to a server gone makes torch
    print a C++ stack trace before it raises, which is kept off the job's output."""
    if not server_answers(store):
        return None
    with stderr_without_cpp_stacks():
        try:
            return request()
        except Exception:  # noqa: BLE001 - the server went as it was asked
            return None


def server_answers(store: Any, within_s: float = 2.0) -> bool:
    """Whether the store's server takes a connection: asking one that has gone fails, and one that cannot be
    reached waits (see `asked`)."""
    while hasattr(store, "underlying_store"):  # torchrun's PrefixStore around its TCPStore
        store = store.underlying_store
    if not hasattr(store, "host"):  # no server to knock on: ask it
        return True
    try:
        socket.create_connection((store.host, store.port), timeout=within_s).close()
    except OSError:
        return False
    return True


@contextmanager
def stderr_without_cpp_stacks():
    """The process's stderr (fd 2, which C++ writes to) held for the block, then passed on without torch's C++
    stack traces. Other threads' lines written meanwhile come out after the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if line.strip() and not CPP_STACK_LINE.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


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
