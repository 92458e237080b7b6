"""What every rank holds: the tracker interface that does nothing, and the one of ranks other than 0 (host samples,
failure reports)."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta

from ..environments.store import asked
from ..errors import UserError
from . import signals
from .sampler import HostSampler

FAILURE_KEY, ACK_KEY = "mpi_train/failure", "mpi_train/failure_ack"
ACK_WAIT_S = 10.0  # a failing rank waits this long for rank 0 to record its failure before aborting
ENDED_KEY = "mpi_train/ended"  # set by rank 0 once the runs' end is recorded
ENDED_WAIT_S = 20.0  # how long a signalled rank waits for that under srun or torchrun before exiting


class NullTracker:
    """Tracking off, or nothing for this rank to do; also the interface the others implement."""

    parent_id: str | None = None  # the job's MLflow run, stored in checkpoints so a resumed job can link to it
    sampler: HostSampler | None = None  # set on the first rank of each host when system metrics are on

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace) -> bool:
        return False

    def where(self) -> str | None:
        """Where the job's runs can be seen (tracking off, or not rank 0: nowhere)."""
        return None

    def host_sample(self) -> dict:
        """What this rank adds to the logged-step gather (system metrics of its host, if it samples them)."""
        return self.sampler.sample() if self.sampler else {}

    def console(self, line: str) -> None: ...
    def log_stall(self, stall) -> None: ...
    def log_straggler(self, straggler) -> None: ...
    def log_step(self, epoch: int, step: int, loss: float, times: dict, throughput: float, per_rank: list[dict],
                 lr: float | None = None) -> None: ...
    def log_epoch(self, epoch: int, step: int, test_loss: float, test_accuracy: float,
                  epoch_time_s: float) -> None: ...
    def log_eval(self, step: int, test_loss: float, test_accuracy: float, elapsed_s: float, sent_mb: float,
                 perplexity: float | None = None) -> None: ...
    def finish(self, summary: dict) -> None: ...
    def commit(self) -> None:
        """A checkpoint covers everything logged so far (see MlflowTracker.commit)."""
    def unsent(self) -> list[tuple]:
        """Metrics held for the checkpoint being taken, as (run id, key, value, timestamp, step): stored in it, so
        that an attempt resuming from it sends what this one may not have (see MlflowTracker.resend)."""
        return []
    def resend(self, points: list[tuple]) -> None:
        """Send what `unsent` stored in the checkpoint this job resumes."""
    def requeue(self, reason: str) -> None:
        """The job stops early to be requeued (preemption.py): its runs end KILLED, `reason` in a tag."""
    def diverged(self, step: int, rank: int, message: str) -> None:
        """Training diverged at `step`, first seen on `rank` (preemption.py): its runs end FAILED, the step in a tag,
        `message` as the error."""
    def save_weights(self, state: dict) -> str | None:
        """The trained model, `state` its whole state_dict on CPU, as an MLflow model of the job's run (see
        MlflowTracker.save_weights); the code that loads it, if it can be loaded now."""
        return None
    def log_artifact(self, path, folder: str) -> None: ...
    def unrecorded(self) -> str | None:
        """What the job's runs lack because the store refused writes (store_writes.py), in a sentence; None if
        nothing."""
        return None


class RankTracker(NullTracker):
    """A rank other than 0: samples its host if it is that host's first rank, and reports its own failure."""

    def __init__(self, store, info, sampler: HostSampler | None, signalled_together: bool = False,
                 cut_off: Callable[[], float] = lambda: 0.0, preemption=None):
        self.store, self.info, self.sampler = store, info, sampler
        self.preemption = preemption
        self.cut_off = cut_off  # seconds rank 0's host has not answered this rank's heartbeat (liveness.py)
        self.signalled_together = signalled_together  # srun, torchrun: SIGTERM reaches every rank at once
        self.previous: dict = {}  # the SIGTERM handler this rank had, while it waits on rank 0 (__enter__)

    def __enter__(self):
        """Under srun or torchrun a signal reaches every rank, and a rank that dies at once makes the
        launcher kill rank 0 before it has recorded the run: wait for rank 0 to say it has (ENDED_KEY),
        or for its store to go away, then exit. mpirun signals only rank 0 first."""
        if self.signalled_together and self.store is not None and signals.on_main_thread():
            if self.preemption is not None and self.preemption.terminate_at_boundary:
                self.preemption.late_terminate = lambda: self._await_rank0(signals.TERMINATE, None)
            else:
                self.previous = signals.install((signals.TERMINATE,), self._await_rank0)
        return self

    def _await_rank0(self, number, frame) -> None:
        # rank 0 (and its store) gone, or too slow: leave now
        asked(self.store, lambda: self.store.wait([ENDED_KEY], timedelta(seconds=ENDED_WAIT_S)))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + number)

    def __exit__(self, kind, error, trace) -> bool:
        signals.restore(self.previous)
        self.previous = {}
        if error is None or isinstance(error, KeyboardInterrupt) or (isinstance(error, UserError) and error.collective):
            return False  # a clean end, a signal (rank 0 records those), or an error rank 0 raised too
        if self.cut_off():  # rank 0 cannot hear us: it names this host itself, and the store would only make us wait
            return False
        failure = {"rank": self.info.rank, "host": self.info.host,
                   "traceback": "".join(traceback.format_exception(kind, error, trace))}

        def report() -> None:  # rank 0's watcher ends the run FAILED and acknowledges; then rankguard aborts the job
            self.store.set(FAILURE_KEY, json.dumps(failure))
            self.store.wait([ACK_KEY], timedelta(seconds=ACK_WAIT_S))

        asked(self.store, report)  # rank 0 gone, unreachable or slow: aborting matters more
        return False
