"""MPI (mpirun, mpiexec, srun with PMI/PMIx): everything from mpi4py's COMM_WORLD.

No launcher-specific variable is trusted for the answers: ranks and hosts come from
COMM_WORLD and its shared-memory split, so any MPI launcher works. Without a launcher,
MPI starts as a singleton and the job is one rank.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .base import ClusterEnvironment, ObjectChannel

# Set by MPI launchers in every rank: Open MPI, PMIx (srun --mpi=pmix), PMI-1/2 (MPICH, Intel MPI, srun --mpi=pmi2),
# MVAPICH.
MPI_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


# A communicator for the ranks' last barrier alone (stopped_together), duplicated at connect: a barrier on COMM_WORLD
# could be taken for the collective that a rank still running waits in.
_ENDING: Any = None
ENDING_POLL_S = 0.01


def stopped_together(within_s: float | None) -> bool:
    """Whether every rank has come to its end too, waiting at most `within_s` (None: as long as it takes), so that
    MPI_Finalize, which waits for every rank, cannot wait for a rank blocked in a collective for ever."""
    if _ENDING is None or _ENDING.Get_size() == 1:
        return True
    if within_s is None:
        _ENDING.Barrier()
        return True
    request, deadline = _ENDING.Ibarrier(), time.monotonic() + within_s
    while not request.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(ENDING_POLL_S)
    return True


class MpiChannel(ObjectChannel):
    """Bytes through MPI's buffer collectives (lengths first, then the bytes): mpi4py's object collectives
    would unpickle whatever arrives."""

    def __init__(self, comm: Any):
        self.comm = comm

    def _lengths(self, data: bytes | None, root_only: bool = False):
        import numpy as np

        mine = np.array([len(data) if data is not None else 0], dtype=np.int64)
        lengths = np.zeros(self.comm.Get_size(), dtype=np.int64)
        if root_only:
            self.comm.Gather(mine, lengths, root=0)
        else:
            self.comm.Allgather(mine, lengths)
        return lengths

    @staticmethod
    def _split(buffer, lengths) -> list[bytes]:
        offsets = [0, *lengths.cumsum().tolist()]
        return [buffer[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(lengths))]

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        import numpy as np

        lengths = self._lengths(data)
        buffer = np.empty(int(lengths.sum()), dtype=np.uint8)
        self.comm.Allgatherv(np.frombuffer(bytearray(data), dtype=np.uint8), (buffer, lengths))
        return self._split(buffer, lengths)

    def bcast_bytes(self, data: bytes) -> bytes:
        import numpy as np

        root = self.comm.Get_rank() == 0
        length = np.array([len(data) if root else 0], dtype=np.int64)
        self.comm.Bcast(length, root=0)
        buffer = np.frombuffer(bytearray(data), dtype=np.uint8) if root else np.empty(int(length[0]), dtype=np.uint8)
        self.comm.Bcast(buffer, root=0)
        return buffer.tobytes()

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        import numpy as np

        root = self.comm.Get_rank() == 0
        lengths = self._lengths(data, root_only=True)
        buffer = np.empty(int(lengths.sum()), dtype=np.uint8) if root else None
        self.comm.Gatherv(np.frombuffer(bytearray(data), dtype=np.uint8), (buffer, lengths) if root else None, root=0)
        return self._split(buffer, lengths) if root else None

    def scatter_bytes(self, parts: list[bytes] | None) -> bytes:
        import numpy as np

        root = self.comm.Get_rank() == 0
        lengths = np.array([len(part) for part in parts], dtype=np.int64) if root else None
        length = np.zeros(1, dtype=np.int64)
        self.comm.Scatter(lengths, length, root=0)
        buffer = np.empty(int(length[0]), dtype=np.uint8)
        sent = (np.frombuffer(bytearray(b"".join(parts)), dtype=np.uint8), lengths) if root else None
        self.comm.Scatterv(sent, buffer, root=0)
        return buffer.tobytes()

    def abort(self, code: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if self.comm.Get_size() > 1:
            self.comm.Abort(code)
        os._exit(code)


DAEMON_KILL_AFTER_S = 5  # SIGKILL after SIGTERM: a daemon whose orderly exit waits for mpirun across the cut link
REACH_TIMEOUT_S = 2.0  # a TCP connect to mpirun that has not succeeded by then: the link is down
# mpirun's address in a daemon's arguments
_LAUNCHER_URI = re.compile(r'[op]rte_hnp_uri\s+"?[^;\s]*;tcp://([0-9.,]+):(\d+)')


def launcher_reachable(daemon_arguments: str) -> bool | None:
    """Whether mpirun (its address from a launch daemon's command line) answers a TCP connect now; None if the
    command line does not say where it is."""
    found = _LAUNCHER_URI.search(daemon_arguments)
    if not found:
        return None
    port = int(found.group(2))
    for address in found.group(1).split(","):
        try:
            socket.create_connection((address, port), timeout=REACH_TIMEOUT_S).close()
            return True
        except OSError:
            continue
    return False


LAUNCH_DAEMONS = ("prted", "orted")  # what Open MPI's mpirun starts on each host, the ranks' parent there
# the processes that start a rank: mpirun itself on its own host (Open MPI 5 runs as prterun), a daemon elsewhere
RANK_PARENTS = (*LAUNCH_DAEMONS, "prterun", "mpirun", "orterun", "mpiexec")
LAUNCHER_POLL_S = 1.0


def parent_process() -> tuple[int, str] | None:
    """This process's parent: its pid and name (/proc's comm), or None where /proc does not say."""
    parent = os.getppid()
    try:
        return parent, Path(f"/proc/{parent}/comm").read_text().strip()
    except OSError:
        return None


class MpiEnvironment(ClusterEnvironment):
    name = "mpi"

    def __init__(self, env: Mapping[str, str] = os.environ, timeout_s: float | None = None):
        # MPI's answers come from COMM_WORLD once connected, never from variables
        self._launcher: tuple[int, str] | None = None  # the parent watch_launcher watches: its pid and name

    def connect(self) -> None:
        from mpi4py import MPI  # initialises MPI: done here, never at import time

        self.comm = MPI.COMM_WORLD
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.comm.Get_rank())
        self._local_rank, self._local_size = local.Get_rank(), local.Get_size()
        import numpy as np

        leader = np.array([self.comm.Get_rank()], dtype=np.int64)
        local.Bcast(leader, root=0)  # the host's first rank identifies the host (a buffer: nothing unpickled)
        self._leader = int(leader[0])
        local.Free()
        self._channel = MpiChannel(self.comm)
        global _ENDING  # one per process, made while every rank is here to take part
        _ENDING = self.comm.Dup()

    @staticmethod
    def detect(env: Mapping[str, str] = os.environ) -> bool:
        return any(name in env for name in MPI_VARIABLES)

    def watch_launcher(self, on_gone: Callable[[str], None]) -> None:
        """mpirun killed by SIGKILL (or a host's daemon gone) leaves its ranks running: nothing ends them, and
        their output has no reader. A rank whose parent is mpirun or its daemon watches for the parent's end,
        which makes this process a child of another (getppid changes), and then calls `on_gone`."""
        launcher = parent_process()
        if launcher is None or launcher[1] not in RANK_PARENTS:  # a wrapper script in between, or no launcher
            return
        self._launcher = launcher

        def watch() -> None:
            while not (gone := self.launcher_lost()):
                time.sleep(LAUNCHER_POLL_S)
            on_gone(gone)

        threading.Thread(target=watch, name="mpi_train-launcher-watch", daemon=True).start()

    def launcher_lost(self) -> str | None:
        if self._launcher is None or os.getppid() == self._launcher[0]:
            return None
        return f"{self._launcher[1]} (pid {self._launcher[0]})"

    def end_daemon_if_cut_off(self, delay_s: float) -> None:
        """A host cut off from mpirun keeps its launch daemon, waiting for orders that cannot arrive, after its
        ranks are gone. So if the daemon that started this rank cannot reach mpirun's address now, it is ended
        `delay_s` from now by a detached sleeper, whatever becomes of this process (SIGTERM, which ends its other
        ranks; SIGKILL 5 s later, as a daemon may wait on mpirun, across the cut link, to exit in order). A daemon
        that can reach mpirun is left alone: mpirun ends it, and a daemon lost on the wrong side would make
        mpirun end the job with exit status 0."""
        daemon = parent_process()
        if daemon is None:
            return
        parent, name = daemon
        try:
            arguments = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return
        if name not in LAUNCH_DAEMONS or launcher_reachable(arguments) is not False:
            return
        still = f'[ "$(cat /proc/{parent}/comm 2>/dev/null)" = {name} ]'  # not a process that took its pid since
        script = (f"sleep {delay_s:g}; {still} && kill -TERM {parent} || exit 0; "
                  f"for i in $(seq {DAEMON_KILL_AFTER_S}); do sleep 1; {still} || exit 0; done; kill -KILL {parent}")
        try:
            subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
        except OSError:  # no sleeper to be had: end the daemon now
            try:
                os.kill(parent, signal.SIGTERM)
            except OSError:
                pass

    def world_size(self) -> int:
        return self.comm.Get_size()

    def global_rank(self) -> int:
        return self.comm.Get_rank()

    def local_rank(self) -> int:
        return self._local_rank

    def node_key(self) -> Any:
        return self._leader

    @property
    def main_address(self) -> str | None:
        return None  # chosen by rank 0 at rendezvous (see cluster.rendezvous_address)

    @property
    def main_port(self) -> int | None:
        return None  # rank 0's store takes a free port and sends it over MPI

    @property
    def channel(self) -> ObjectChannel:
        return self._channel
