"""MPI (mpirun, mpiexec, srun with PMI/PMIx): everything from mpi4py's COMM_WORLD.

No launcher-specific variable is trusted for the answers: ranks and hosts come from
COMM_WORLD and its shared-memory split, so any MPI launcher works. Without a launcher,
MPI starts as a singleton and the job is one rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any, Mapping, Optional

from .base import ClusterEnvironment, ObjectChannel

# Set by MPI launchers in every rank: Open MPI, PMIx (srun --mpi=pmix), PMI-1/2 (MPICH, Intel MPI, srun --mpi=pmi2), MVAPICH.
MPI_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


class MpiChannel(ObjectChannel):
    def __init__(self, comm: Any):
        self.comm = comm

    def allgather(self, value: Any) -> list:
        return self.comm.allgather(value)

    def bcast(self, value: Any) -> Any:
        return self.comm.bcast(value, root=0)

    def gather(self, value: Any) -> Optional[list]:
        return self.comm.gather(value, root=0)

    def scatter(self, values: Optional[list]) -> Any:
        return self.comm.scatter(values, root=0)

    def abort(self, code: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if self.comm.Get_size() > 1:
            self.comm.Abort(code)
        os._exit(code)


DAEMON_END_DELAY_S = 3  # after a cut-off rank's exit: time for its daemon to report it, if it can
LAUNCH_DAEMONS = ("prted", "orted")  # what Open MPI's mpirun starts on each host, the ranks' parent there


class MpiEnvironment(ClusterEnvironment):
    name = "mpi"

    def __init__(self, env: Mapping[str, str] = os.environ):
        pass  # MPI's answers come from COMM_WORLD once connected, never from variables

    def connect(self) -> None:
        from mpi4py import MPI  # initialises MPI: done here, never at import time

        self.comm = MPI.COMM_WORLD
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.comm.Get_rank())
        self._local_rank, self._local_size = local.Get_rank(), local.Get_size()
        self._leader = local.bcast(self.comm.Get_rank(), root=0)  # the host's first rank identifies the host
        local.Free()
        self._channel = MpiChannel(self.comm)

    @staticmethod
    def detect(env: Mapping[str, str] = os.environ) -> bool:
        return any(name in env for name in MPI_VARIABLES)

    def leave_cut_off(self, code: int) -> None:
        """A host cut off from mpirun keeps its launch daemon, waiting for orders that cannot arrive, after its
        ranks are gone; so the daemon that started this rank is ended too (SIGTERM, which ends its other ranks).
        This rank exits first and the daemon is ended a moment later, by a detached sleeper: a daemon that can
        still reach mpirun (rank 0 stopped, not the link) reports the rank's exit status, and mpirun exits
        non-zero rather than with the 0 of a job whose daemon just vanished."""
        parent = os.getppid()
        try:
            with open(f"/proc/{parent}/comm") as handle:
                name = handle.read().strip()
        except OSError:
            name = ""
        if name in LAUNCH_DAEMONS:
            try:
                subprocess.Popen(["/bin/sh", "-c", f"sleep {DAEMON_END_DELAY_S}; kill -TERM {parent} 2>/dev/null"],
                                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, close_fds=True)
            except OSError:  # no sleeper to be had: end the daemon now
                try:
                    os.kill(parent, signal.SIGTERM)
                except OSError:
                    pass
        super().leave_cut_off(code)

    def world_size(self) -> int:
        return self.comm.Get_size()

    def global_rank(self) -> int:
        return self.comm.Get_rank()

    def local_rank(self) -> int:
        return self._local_rank

    def node_key(self) -> Any:
        return self._leader

    @property
    def main_address(self) -> Optional[str]:
        return None  # chosen by rank 0 at rendezvous (see cluster.rendezvous_address)

    @property
    def main_port(self) -> Optional[int]:
        return None  # rank 0's store takes a free port and sends it over MPI

    @property
    def channel(self) -> ObjectChannel:
        return self._channel
