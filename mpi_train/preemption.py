"""Preemption and time limits: SIGUSR1 asks the job to checkpoint at the next step boundary and exit for requeue.

Slurm sends it ahead of a job's time limit or preemption (slurm/train.sbatch asks for it with
--signal=USR1@SECONDS); srun passes it to every task and mpirun to every rank. A rank may get it
in the middle of a step, and ranks at different moments, so each rank only notes it and at every
step boundary the ranks agree (a one-number all-reduce: any rank's note counts for all). Then
every rank has trained the same steps: the job writes a checkpoint there, records its MLflow
run as KILLED with the reason in a tag, and exits with REQUEUE_EXIT. The batch script requeues
the job on that status, and the requeued job continues the same run with --resume auto.

Only a job with --checkpoint-dir listens (it has somewhere to go on from); elsewhere SIGUSR1
keeps its default action.
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist

REQUEUE_EXIT = 75  # EX_TEMPFAIL: stopped to be run again, from its checkpoint
SIGNAL = signal.SIGUSR1


class Preemption:
    """Whether SIGUSR1 has reached any rank, asked once a step (collective)."""

    def __init__(self, listening: bool, world_size: int, device: torch.device):
        self.listening = listening and threading.current_thread() is threading.main_thread()
        self.world_size, self.device = world_size, device
        self.received = False
        if self.listening:
            self.previous = signal.signal(SIGNAL, self._note)

    def _note(self, number, frame) -> None:
        self.received = True

    def agreed(self) -> bool:
        """True on every rank once any rank has received the signal; collective when listening."""
        if not self.listening:
            return False
        if self.world_size == 1:
            return self.received
        flag = torch.tensor([1.0 if self.received else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def leave_together(self) -> None:
        """Collective, once the run's end is recorded: from here a launcher's SIGTERM is ignored, so that srun
        --kill-on-bad-exit, seeing the first rank leave with REQUEUE_EXIT, does not turn the others' status
        into 143 and the batch script's requeue into a failure."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        if self.listening:
            signal.signal(SIGNAL, self.previous)
            self.listening = False
