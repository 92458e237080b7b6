"""What the ranks decide together at every step boundary, in one small all-reduce: whether to stop for requeue
(SIGUSR1), and whether training has diverged (a loss or weights gone inf or NaN).

Preemption and time limits: SIGUSR1 asks the job to checkpoint at the next step boundary and exit for requeue.
Slurm sends it ahead of a job's time limit or preemption (slurm/train.sbatch asks for it with
--signal=USR1@SECONDS); srun passes it to every task and mpirun to every rank. A rank may get it
in the middle of a step, and ranks at different moments, so each rank only notes it and at every
step boundary the ranks agree (any rank's note counts for all). Then every rank has trained the
same steps: the job writes a checkpoint there, records its MLflow run as KILLED with the reason in
a tag, and exits with REQUEUE_EXIT. The batch script requeues the job on that status, and the
requeued job continues the same run with --resume auto. Only a job with --checkpoint-dir listens
(it has somewhere to go on from); elsewhere SIGUSR1 keeps its default action. Its handlers go through
tracking/signals.py, which holds every signal handler a rank installs.

Under torchrun's agent SIGTERM most often means the same: a node joined or left, and the agent stops the workers to
restart them at the new world size, killing them 30 s later. A job that checkpoints takes that SIGTERM as SIGUSR1,
so the restart loses no step. What SIGTERM does elsewhere (the run recorded KILLED, the rank gone) is done only if
the ranks have not agreed to stop TERMINATE_GRACE_S after it: a rank held in a collective by a lost node never
reaches a step boundary.

Divergence: a rate too high for the model makes the loss, then the weights, overflow to inf or NaN, and training
would go on computing NaNs. The ranks hold different losses (their own batches) and, under the model-averaging
methods, different weights, so each rank puts its loss and the norm of the weights it holds into the same
all-reduce, and a value that is not finite on any rank stops every rank at the same step, before that step is
logged or checkpointed: the last checkpoint holds finite weights.

The host does not wait for the GPU to learn the outcome (as clock.StepClock does not): on a GPU a step's outcome is
copied back behind its work and read at the next step boundary, unless the host waits for that step anyway (it
logs, checks, scores or checkpoints it). On CPUs the all-reduce answers at once.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.utils import get_total_norm

from .sync.base import local_part
from .tracking import signals

REQUEUE_EXIT = 75  # EX_TEMPFAIL: stopped to be run again, from its checkpoint
SIGNAL = signals.REQUEUE
# torchrun's agent sends SIGKILL 30 s after SIGTERM: this leaves the run's end time to be recorded
TERMINATE_GRACE_S = 15.0


class Preemption:
    """Whether SIGUSR1 (or, with `terminate_at_boundary`, SIGTERM) has reached this rank (StepAgreement shares it
    with the others)."""

    def __init__(self, listening: bool, world_size: int, terminate_at_boundary: bool = False):
        self.listening = listening and signals.on_main_thread()
        self.world_size = world_size
        self.received: str | None = None  # the name of the first signal that asked for the stop
        self.agreed = False  # the ranks have agreed to stop at a step boundary (StepAgreement)
        self.terminate_at_boundary = terminate_at_boundary and self.listening
        # what SIGTERM does if the ranks have not agreed to stop in time; a run's tracker puts its own here
        self.late_terminate: Callable[[], None] = lambda: signals.exit_as_killed(signals.TERMINATE)
        self.timer: threading.Timer | None = None
        self.previous = {}
        if self.listening:
            self.previous = signals.install((SIGNAL,), self._note)
        if self.terminate_at_boundary:
            self.previous |= signals.install((signals.TERMINATE,), lambda number, frame: self.terminated())

    def _note(self, number, frame) -> None:
        self.received = self.received or signals.name(number)

    def terminated(self) -> None:
        """SIGTERM under a launcher that restarts the workers (any thread): stop at the next step boundary, or as
        SIGTERM would if the ranks have not agreed to within TERMINATE_GRACE_S."""
        self.received = self.received or signals.name(signals.TERMINATE)
        if self.timer is None:
            self.timer = threading.Timer(TERMINATE_GRACE_S, self._too_late)
            self.timer.daemon = True
            self.timer.start()

    def _too_late(self) -> None:
        if not self.agreed:
            self.late_terminate()

    def leave_together(self) -> None:
        """Collective, once the run's end is recorded: from here a launcher's SIGTERM is ignored, so that srun
        --kill-on-bad-exit, seeing the first rank leave with REQUEUE_EXIT, does not turn the others' status
        into 143 and the batch script's requeue into a failure."""
        signals.ignore(signals.TERMINATE)
        self.previous.pop(signals.TERMINATE, None)  # close() leaves it ignored
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.listening:
            signals.restore(self.previous)
            self.listening = False


def held_norm(weights: Iterable[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of the weights this rank holds (a DTensor's own shard): inf or NaN when any weight is, as
    torch's clip_grad_norm_ tells a non-finite gradient, in a few fused kernels and without a wait. Finite weights
    whose squares' sum overflows float32 (one weight of about 1e19) read as not finite too: no model trains there."""
    return get_total_norm([local_part(weight) for weight in weights])


@dataclass(frozen=True)
class Divergence:
    """The first step whose loss or weights were not finite on some rank, as every rank agreed."""

    step: int
    loss_ranks: tuple[int, ...]  # ranks whose loss at `step` was inf or NaN
    weight_ranks: tuple[int, ...]  # ranks whose weights the step's update left inf or NaN
    losses: tuple[float, ...]  # every rank's loss at `step`
    last_finite: tuple[int, float] | None  # the last step read whose losses were all finite, and their mean

    @property
    def first_rank(self) -> int:
        return min(self.loss_ranks + self.weight_ranks)

    def message(self, lr: float, warmup_steps: int, checkpointing: bool = False, latest: Path | None = None) -> str:
        """The paragraph every rank raises: what went inf or NaN where, the last finite loss, what is kept, what to
        try. `checkpointing`: the job has a --checkpoint-dir; `latest`: the newest checkpoint there, if any."""
        seen = []
        if self.loss_ranks:
            values = ", ".join(sorted({str(self.losses[rank]) for rank in self.loss_ranks}))
            seen.append(f"the loss was {values} on rank(s) {', '.join(map(str, self.loss_ranks))}")
        if self.weight_ranks:
            seen.append(f"the step's update left weights that are inf or NaN on rank(s) "
                        f"{', '.join(map(str, self.weight_ranks))}")
        if not self.loss_ranks:
            last = f" (its loss, averaged over the ranks, was still finite: {statistics.fmean(self.losses):.6g})"
        elif self.last_finite:
            last = (f" (the last finite loss, averaged over the ranks, was {self.last_finite[1]:.6g} at step "
                    f"{self.last_finite[0]})")
        else:
            last = " (this job's first step, with no finite loss before it)"
        kept = ""
        if checkpointing and latest:
            kept = (f"; no checkpoint holds its weights, and those before it are kept (the latest: {latest}; "
                    f"resume only from one taken before the loss began to climb)")
        elif checkpointing:
            kept = ", before its first checkpoint"
        if self.loss_ranks and not self.last_finite:  # its first loss: computed before this job updated anything
            cause = ("No update had been made yet, so the rate is not the cause: the data (an inf or NaN among the "
                     "inputs), the model's forward, or float16's range under --precision 16-mixed gave this loss. "
                     "Check the data set's items and the model's output on one batch.")
        else:
            cause = (f"Most often the rate is too high for this model and batch: try a lower --lr (this job's peak "
                     f"rate is {lr:g}), a longer --warmup-steps (this job's: {warmup_steps}), --clip-grad-norm 1.0, "
                     f"or --optimizer adamw, whose steps do not grow with the gradient. Were the losses before it "
                     f"steady, look at the batch's data instead: an inf or NaN among the inputs diverges any rate.")
        return f"training diverged at step {self.step}: {' and '.join(seen)}{last}. Every rank stopped{kept}. {cause}"


class StepAgreement:
    """SIGUSR1 and the finiteness of every rank's step, agreed in one all-reduce a step (collective).

    `signalled` and `diverged` hold what has been read so far; every rank reads the same steps at the same
    boundary, so they agree."""

    def __init__(self, preemption: Preemption, rank: int, world_size: int, device: torch.device,
                 lagged: bool | None = None):
        self.preemption, self.rank, self.world_size, self.device = preemption, rank, world_size, device
        self.lagged = device.type == "cuda" if lagged is None else lagged  # a step read once the next is posted
        self.pending: list[tuple[int, torch.Tensor, torch.cuda.Event | None]] = []  # (step, values, copied back)
        self.diverged: Divergence | None = None
        self.last_finite: tuple[int, float] | None = None  # step and mean loss of the last step read all finite

    @property
    def signalled(self) -> bool:
        """SIGUSR1 (or a SIGTERM taken as it) reached some rank: the ranks stop at this boundary."""
        return self.preemption.agreed

    def post(self, step: int, loss: torch.Tensor, weights: Iterable[torch.Tensor]) -> None:
        """Share this step's signal, loss and weights' norm (collective; no weights: a norm of 0, not checked).
        Values: [signal, loss of rank 0, norm of rank 0, loss of rank 1, ...], each rank filling its own and zeros
        elsewhere, summed: adding zeros is exact, so an inf or NaN stays in the slot of the rank that had it."""
        values = torch.zeros(1 + 2 * self.world_size, dtype=torch.float32, device=self.device)
        if self.preemption.received:
            values[0] = 1.0
        values[1 + 2 * self.rank:3 + 2 * self.rank] = torch.stack([loss.detach().float(),
                                                                  held_norm(weights).float().to(self.device)])
        if self.world_size > 1:
            dist.all_reduce(values)
        copied = None
        if self.device.type == "cuda":  # behind the step's work on its stream: read without waiting for later steps
            values = torch.empty(values.shape, dtype=values.dtype, pin_memory=True).copy_(values, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        self.pending.append((step, values, copied))

    def read(self, wait: bool) -> None:
        """Take in the outcomes of the steps posted: all of them when `wait`, else (lagged) all but the newest. A
        signal read a step late takes in the newest too: the job checkpoints that step, so its outcome must be
        known first."""
        ready = self.pending if wait or not self.lagged else self.pending[:-1]
        self.pending = self.pending[len(ready):]
        for step, values, copied in ready:
            if copied is not None:
                copied.synchronize()
            self._take(step, values.tolist())
        if self.signalled and self.pending:
            self.read(wait=True)

    def _take(self, step: int, values: list[float]) -> None:
        self.preemption.agreed = self.preemption.agreed or values[0] > 0
        if self.diverged:  # the first divergence is the one to report
            return
        losses, norms = values[1::2], values[2::2]
        loss_ranks = tuple(rank for rank, loss in enumerate(losses) if not math.isfinite(loss))
        weight_ranks = tuple(rank for rank, norm in enumerate(norms) if not math.isfinite(norm))
        if not loss_ranks:
            self.last_finite = (step, statistics.fmean(losses))
        if loss_ranks or weight_ranks:
            self.diverged = Divergence(step=step, loss_ranks=loss_ranks, weight_ranks=weight_ranks,
                                       losses=tuple(losses), last_finite=self.last_finite)
