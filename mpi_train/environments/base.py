"""What every cluster environment answers: who this process is, and how the ranks reach each other.

One small class per launcher (mpi.py, torchrun.py, slurm.py), in the manner of Lightning
Fabric's plugins/environments: `detect` reads only the environment variables, so choosing
one never starts anything; an environment's constructor reads variables, and `connect()` joins the job.
"""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import UserError
from ..wire import decode, encode

DAEMON_END_DELAY_S = 1  # a cut-off host's daemon is ended this long after its rank's abort: its console lines go first


class ObjectChannel(ABC):
    """Small-object collectives the job needs before (and besides) the torch process group.

    A channel moves bytes; values travel encoded by wire.py (JSON, or torch's weights-only format), never
    pickled, and are checked as they arrive."""

    def origin(self, collective: str, rank: int | None = None) -> str:
        """How a refused value's origin is named in the error."""
        return f"an object collective ({collective}{'' if rank is None else f', from rank {rank}'})"

    def allgather(self, value: Any) -> list:
        return [decode(data, self.origin("allgather", rank))
                for rank, data in enumerate(self.allgather_bytes(encode(value)))]

    def bcast(self, value: Any) -> Any:
        """Rank 0's value on every rank."""
        return decode(self.bcast_bytes(encode(value)), self.origin("broadcast"))

    def gather(self, value: Any) -> list | None:
        """Every rank's value on rank 0; None elsewhere."""
        gathered = self.gather_bytes(encode(value))
        if gathered is None:
            return None
        return [decode(data, self.origin("gather", rank)) for rank, data in enumerate(gathered)]

    def scatter(self, values: list | None) -> Any:
        """values[r] (given on rank 0) on rank r."""
        data = self.scatter_bytes([encode(value) for value in values] if values is not None else None)
        return decode(data, self.origin("scatter"))

    @abstractmethod
    def allgather_bytes(self, data: bytes) -> list[bytes]: ...

    @abstractmethod
    def bcast_bytes(self, data: bytes) -> bytes:
        """Rank 0's bytes on every rank (the others' `data` is ignored)."""

    @abstractmethod
    def gather_bytes(self, data: bytes) -> list[bytes] | None: ...

    @abstractmethod
    def scatter_bytes(self, parts: list[bytes] | None) -> bytes: ...

    @abstractmethod
    def abort(self, code: int) -> None:
        """End every rank of the job now (a peer may be blocked in a collective)."""


class ClusterEnvironment(ABC):
    """One launcher's answers. The constructor only reads variables; connect() joins the job (MPI_Init, the env://
    store)."""

    name: str  # the --launcher value

    @abstractmethod
    def connect(self) -> None:
        """Join the other ranks; world_size() and the rest may need it first (MPI's do)."""

    @staticmethod
    @abstractmethod
    def detect(env: Mapping[str, str] = os.environ) -> bool:
        """True if this launcher started the process (read from variables only; starts nothing)."""

    @abstractmethod
    def world_size(self) -> int: ...

    @abstractmethod
    def global_rank(self) -> int: ...

    @abstractmethod
    def local_rank(self) -> int:
        """Index among the ranks on this host."""

    @abstractmethod
    def node_key(self) -> Any:
        """Equal for ranks on one host, different across hosts (the host's identity, not its label)."""

    @property
    @abstractmethod
    def main_address(self) -> str | None:
        """Where rank 0's rendezvous store listens; None when the job chooses it (MPI)."""

    @property
    @abstractmethod
    def main_port(self) -> int | None: ...

    @property
    @abstractmethod
    def channel(self) -> ObjectChannel: ...

    @property
    def store(self):
        """The torch store the ranks share from the start (env://), or None if the process group must open one."""
        return None

    @property
    def resizes_on_restart(self) -> bool:
        """True where the launcher itself may restart the job at another world size, adding no flag (torchrun's
        agent): --resume auto then continues a checkpoint of any world size, as --reshard does."""
        return False

    def resized_split_error(self, batch_size: int, accumulate: int) -> str | None:
        """Under a launcher that resizes the job: why the global batch does not split across this attempt's ranks,
        said in the launcher's terms; None where it splits (or the launcher never resizes)."""
        return None

    def watch_launcher(self, on_gone: Callable[[str], None]) -> None:
        """Call `on_gone(what)` from a thread should the launcher's process that started this rank end before it
        (mpi.py)."""

    def launcher_lost(self) -> str | None:
        """The launcher's process that watch_launcher watches, named, if it has ended; else None."""
        return None

    def end_daemon_if_cut_off(self, delay_s: float) -> None:
        """End this host's launch daemon `delay_s` from now if it can no longer reach the launcher (mpi.py)."""


def whole_number(env: Mapping[str, str], name: str, launcher: str) -> int:
    """A launcher's variable that must hold a whole number, read; one left over from another shell is told so."""
    value = env.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{name}={value!r} is not a whole number, and the {launcher} launcher reads this process's "
                        f"place in the job from it. {left_over(launcher)}") from None


def check_place(environment: ClusterEnvironment) -> None:
    """A rank and world size read from variables must make a place in a job, checked before meeting: ranks that
    cannot all come would wait out the timeout."""
    rank, world = environment.global_rank(), environment.world_size()
    if not 0 <= rank < world:
        raise UserError(f"the {environment.name} launcher's variables put this process at rank {rank} of {world}, "
                        f"which no job has. {left_over(environment.name)}")


def left_over(launcher: str) -> str:
    return (f"If {launcher} did not start this process, its variables are left over from elsewhere (a shell's "
            f"exports, a batch script): unset them, or name the launcher that did start it with --launcher.")


def check_meeting_point(environment: ClusterEnvironment, variables: str) -> None:
    """The store's host must resolve before the ranks wait there: torch would retry a name that never resolves,
    warning each time, until the timeout."""
    host, port = environment.main_address, environment.main_port
    try:
        socket.getaddrinfo(host, port)
    except (OSError, UnicodeError):
        raise UserError(f"the ranks meet at {host}:{port} ({variables}), and {host} does not resolve on this host. "
                        f"{left_over(environment.name)}") from None


def meeting_failed(environment: ClusterEnvironment, variables: str, error: BaseException, timeout_s: float) -> str:
    """Why the ranks of a launcher that meets through a store (torchrun, srun) did not meet, in one paragraph."""
    host, port, launcher = environment.main_address, environment.main_port, environment.name
    said = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    if "EADDRINUSE" in said or "address already in use" in said.lower():
        return (f"rank {environment.global_rank()} serves the ranks' meeting point at {host}:{port} ({variables}), "
                f"and port {port} is in use by another program ({said}). Set MASTER_PORT to a free port; "
                f"{left_over(launcher)[0].lower()}{left_over(launcher)[1:]}")
    return (f"the ranks did not meet at {host}:{port} ({variables}) within --timeout {timeout_s:g} s ({said}): "
            f"{environment.world_size()} rank(s) were to meet. Check that every rank's host reaches that address and "
            f"port. {left_over(launcher)}")
