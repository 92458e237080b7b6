"""Fail points: injected failures, so tests can prove that a dying, raising or stuck rank never hangs the job.

Set MPI_TRAIN_FAIL_AT="RANK:POINT[:HOW]" on the launch:
  POINT  start       right after the job starts (config checked, nothing opened yet)
         rendezvous  just before the process group opens (rank 0 has not sent its address)
         N           step N, just before its gradient sync: the other ranks are inside the collective
         eval        at the start of the first evaluation
         checkpointed  right after a checkpoint is written, before the metrics it covers are sent
  HOW    raise (default): a Python exception; kill: SIGKILL to itself; hang: sleep forever; refuse: a
         refusal of bad input (a UserError) on that rank alone, which the job takes for one every rank makes
With MPI_TRAIN_FAIL_ONCE=PATH as well, the failure happens only while PATH does not exist (it is
created then): a relaunched job runs clean, as after a fault that a restart fixes.

Set MPI_TRAIN_OVERFLOW_AT="RANK:STEP" to make one rank's float16 gradients overflow in one step: under --precision
16-mixed, in step STEP's backward on rank RANK, one number of the gradient reaching the first layer's output turns
inf, so that layer's gradients for one output channel hold inf or NaN on that rank alone (under zero and fsdp, in one
rank's shard), and the loss scaler must skip the step on every rank. Jobs at other precisions ignore it: without a
loss scale an inf gradient is divergence, which the faults above and the divergence check already cover.

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
from typing import TYPE_CHECKING

from .errors import UserError

if TYPE_CHECKING:  # the lab's programs read the names above without importing torch
    import torch
    from torch import nn

FAIL_AT_ENV = "MPI_TRAIN_FAIL_AT"
FAIL_ONCE_ENV = "MPI_TRAIN_FAIL_ONCE"
SLOW_ENV = "MPI_TRAIN_SLOW"
OVERFLOW_ENV = "MPI_TRAIN_OVERFLOW_AT"
POINTS = ("start", "rendezvous", "eval", "checkpointed")
HOWS = ("raise", "kill", "hang", "refuse")


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
        if self.how == "refuse":
            raise UserError(f"an injected refusal on rank {rank} at {point} (${FAIL_AT_ENV})")
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


class Overflow:
    """A float16 overflow on one rank in one step: `rank`'s gradient at the output of `model`'s first layer with
    parameters gets an inf at its first number in step `step`'s backward (a tensor hook, so it is there before any
    sync method's hook reads the layer's gradients)."""

    def __init__(self, rank: int, step: int):
        self.rank, self.step = rank, step
        self.armed = False

    @classmethod
    def from_env(cls) -> Overflow | None:
        value = os.environ.get(OVERFLOW_ENV, "")
        if not value:
            return None
        rank, _, step = value.partition(":")
        if not (rank.isdigit() and step.isdigit() and int(step) >= 1):
            raise UserError(f"${OVERFLOW_ENV}={value!r} is not RANK:STEP with a rank of the job and a step from 1 "
                            f"(e.g. {OVERFLOW_ENV}=1:2 makes rank 1's gradients overflow in step 2 of a --precision "
                            f"16-mixed job); unset it for a normal run.")
        return cls(int(rank), int(step))

    def watch(self, model: nn.Module) -> Overflow:
        first = next(module for module in model.modules() if next(module.parameters(recurse=False), None) is not None)
        first.register_forward_hook(self.forwarded)
        return self

    def forwarded(self, _module: nn.Module, _inputs, output: torch.Tensor) -> None:
        if self.armed and output.requires_grad:
            self.armed = False
            output.register_hook(overflowed_gradient)

    def at(self, rank: int, step: int) -> None:
        """Before step `step`'s forward: its first forward of the layer on the named rank and step carries the inf
        into backward."""
        self.armed = (rank, step) == (self.rank, self.step)


def overflowed_gradient(gradient: torch.Tensor) -> torch.Tensor:
    poisoned = gradient.clone()
    poisoned.view(-1)[0] = float("inf")
    return poisoned


class NoOverflow:
    def at(self, rank: int, step: int) -> None:
        pass


def overflowing(model: nn.Module, scaled: bool) -> Overflow | NoOverflow:
    """$MPI_TRAIN_OVERFLOW_AT's overflow, watching `model`, in a job whose loss is scaled; nothing elsewhere."""
    overflow = Overflow.from_env()
    return overflow.watch(model) if overflow is not None and scaled else NoOverflow()
