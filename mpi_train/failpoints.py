"""Fail points: injected failures, so tests can prove that a dying, raising or stuck rank never hangs the job.

Set MPI_TRAIN_FAIL_AT="RANK:POINT[:HOW]" on the launch:
  POINT  start       right after the job starts (config checked, nothing opened yet)
         rendezvous  just before the process group opens (rank 0 has not sent its address)
         N           step N, just before its gradient sync: the other ranks are inside the collective
         eval        at the start of the first evaluation
         checkpointed  right after a checkpoint is written, before the metrics it covers are sent
  HOW    raise (default): a Python exception; kill: SIGKILL to itself; hang: sleep forever
With MPI_TRAIN_FAIL_ONCE=PATH as well, the failure happens only while PATH does not exist (it is
created then): a relaunched job runs clean, as after a fault that a restart fixes.

Set MPI_TRAIN_SLOW="RANK:SECONDS" to make one rank a straggler: every step of that rank takes SECONDS
more compute (a sleep at the end of its backward, before the sync), so the others wait for it.

`python -m mpi_train soak --trials N` makes faults from outside instead: short jobs on test
hosts, each with a random rank killed or stopped, a link taken down or the server stopped
(lab/soak.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from .errors import UserError

FAIL_AT_ENV = "MPI_TRAIN_FAIL_AT"
FAIL_ONCE_ENV = "MPI_TRAIN_FAIL_ONCE"
SLOW_ENV = "MPI_TRAIN_SLOW"
POINTS = ("start", "rendezvous", "eval", "checkpointed")
HOWS = ("raise", "kill", "hang")


class InjectedFailure(RuntimeError):
    """The exception `raise` injects; a bug like any other as far as the job is concerned."""


@dataclass(frozen=True)
class Fault:
    rank: int
    point: str | int
    how: str = "raise"

    @classmethod
    def from_env(cls) -> Fault | None:
        value = os.environ.get(FAIL_AT_ENV, "")
        if not value:
            return None
        parts = value.split(":")
        try:
            rank, point = int(parts[0]), parts[1]
            point = int(point) if point.isdigit() else point
            how = parts[2] if len(parts) > 2 else "raise"
        except (IndexError, ValueError):
            point, how = None, None
        if len(parts) > 3 or point not in POINTS and not isinstance(point, int) or how not in HOWS:
            raise UserError(f"${FAIL_AT_ENV}={value!r} is not RANK:POINT[:HOW] with POINT one of "
                            f"{', '.join(POINTS)} or a step number and HOW one of {', '.join(HOWS)}; "
                            f"unset it for a normal run.")
        return cls(rank, point, how)

    def at(self, rank: int, point: str | int) -> None:
        """Fail here if this is the named rank and point."""
        if (rank, point) != (self.rank, self.point):
            return
        once = os.environ.get(FAIL_ONCE_ENV)
        if once:
            try:
                with open(once, "x"):
                    pass
            except FileExistsError:
                return  # it happened in an earlier launch
        print(f"mpi_train: injecting '{self.how}' on rank {rank} at {point} (unix time {time.time():.3f})",
              file=sys.stderr, flush=True)  # tests time the job's end from here
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.how == "hang":
            while True:
                time.sleep(3600)
        raise InjectedFailure(f"injected failure on rank {rank} at {point} (${FAIL_AT_ENV})")


class NoFault:
    def at(self, rank: int, point: str | int) -> None:
        pass


def injected() -> Fault | NoFault:
    return Fault.from_env() or NoFault()


@dataclass(frozen=True)
class Slowdown:
    """A simulated straggler: `rank` computes `seconds` longer every step."""

    rank: int
    seconds: float

    @classmethod
    def from_env(cls) -> Slowdown | None:
        value = os.environ.get(SLOW_ENV, "")
        if not value:
            return None
        rank, _, seconds = value.partition(":")
        try:
            slowdown = cls(int(rank), float(seconds))
        except ValueError:
            slowdown = None
        if slowdown is None or slowdown.rank < 0 or not 0 <= slowdown.seconds < 3600:
            raise UserError(f"${SLOW_ENV}={value!r} is not RANK:SECONDS with a rank of the job and 0 <= SECONDS < "
                            f"3600 (e.g. {SLOW_ENV}=1:0.3 adds 0.3 s of compute to every step of rank 1); unset it "
                            f"for a normal run.")
        return slowdown

    def at(self, rank: int) -> None:
        """Inside the compute phase of every step: sleep on the slow rank."""
        if rank == self.rank:
            time.sleep(self.seconds)


class NoSlowdown:
    def at(self, rank: int) -> None:
        pass


def slowed() -> Slowdown | NoSlowdown:
    return Slowdown.from_env() or NoSlowdown()
