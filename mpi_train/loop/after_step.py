"""What a finished step owes before the next: the ranks' agreement to go on, the replica check, the phase totals, the
logged step and the checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import preemption, tracking
from ..checkpoint import Position, list_checkpoints
from ..clock import StepClock
from ..cluster import Cluster
from ..config import TrainConfig
from ..preemption import REQUEUE_EXIT, Divergence
from ..reporter import SilentReporter
from ..sync import REPLICATED_VIEW, Synced
from ..tracking import signals
from ..tracking.names import PHASES
from .job import Job
from .replicas import check_replicas_agree
from .train_step import StepTimes


@dataclass
class PhaseTotals:
    """Sums of per-step phase times on this rank, for window and whole-run means."""

    steps: int = 0
    sums: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    def add(self, times: dict) -> None:
        self.steps += 1
        for key in PHASES:
            self.sums[key] += times[key]

    def means(self) -> dict:
        return {key: total / max(1, self.steps) for key, total in self.sums.items()}


class AfterStep:
    """Everything a finished step may owe: the ranks' agreement (a stop for requeue, or for divergence), the replica
    check, the phase totals, the logged step, the checkpoint.

    `after_warmup` leaves out the job's first --timing-warmup-steps, as the course's timing convention asks."""

    def __init__(self, config: TrainConfig, cluster: Cluster, job: Job, clock: StepClock, reporter: SilentReporter,
                 tracker: tracking.NullTracker):
        self.config, self.cluster, self.job, self.reporter, self.tracker = config, cluster, job, reporter, tracker
        self.clock = clock
        self.run_totals, self.window, self.after_warmup = PhaseTotals(), PhaseTotals(), PhaseTotals()
        self.first_step = job.resume.position.step if job.resume else 0
        self.final_checkpoint: dict | None = None  # the last step's, taken at its boundary (rank 0)
        self.requeued: str | None = None  # why the job stopped early to be requeued
        self.diverged: Divergence | None = None  # the step whose loss or weights went inf or NaN, if one did
        self.method_figures: dict = {}  # the sync method's figures since the last logged step (local SGD's drift)

    @property
    def stopped(self) -> bool:
        """The job stops before its last step: for requeue, or because training diverged."""
        return bool(self.requeued or self.diverged)

    def __call__(self, position: Position, loss: torch.Tensor, lr: float, read: list[StepTimes],
                 synced: Synced) -> bool:
        """True when the job stops here: for requeue (preemption.py), or because training diverged. `read`: the
        phase times of the steps the clock has read (on a GPU, the step before this one); a logged step reads this
        one's too."""
        config, step, total_steps = self.config, position.step, self.job.info.total_steps
        self.method_figures.update(synced.figures)
        checked = bool(config.check_every and step % config.check_every == 0)
        logged = step % config.log_every == 0 or step == total_steps or step % self.job.info.steps_per_epoch == 0
        scored = bool(config.eval_every and step % config.eval_every == 0)
        due = self.job.checkpoints.due(step, total_steps)
        self.agree(step, loss, wait=logged or checked or scored or due, with_weights=due)
        if self.diverged:
            return True
        if checked:
            replicated = self.job.method.tensors(self.job.model, REPLICATED_VIEW)
            check_replicas_agree(self.cluster, replicated, f"at step {step}")
        self.count(read + (self.clock.drain() if logged else []))
        if logged:
            self.log(position, loss, lr)
        if due:
            self.checkpoint(position)
        # SIGUSR1 on some rank: stop here, checkpointed
        if step < total_steps and self.job.agreement.signalled:
            self.stop_for_requeue(position, checkpointed=due)
        return bool(self.requeued)

    def agree(self, step: int, loss: torch.Tensor, wait: bool, with_weights: bool) -> None:
        """Every rank's loss, and SIGUSR1, in one all-reduce a step. On a GPU its answer is read a step late, unless
        the host waits for this step anyway: no step gone inf or NaN is logged, checked, scored or checkpointed, and
        every rank stops at the same step. A step that is checkpointed shares its weights' norm too, so that no
        checkpoint holds weights an update left inf or NaN with the loss still finite; elsewhere the next step's loss
        tells, and a norm over every weight each step would cost a large model more than it saves. The weights are
        those the optimizer steps: zero's model takes in its updated shard in the next forward."""
        agreement = self.job.agreement
        weights = ([param for group in self.job.optimizer.param_groups for param in group["params"]]
                   if with_weights else [])
        agreement.post(step, loss, weights)
        agreement.read(wait=wait)
        self.diverged = agreement.diverged

    def log(self, position: Position, loss: torch.Tensor, lr: float) -> None:
        """The logging window's figures from every rank (collective), logged on rank 0; a new window begins."""
        job = self.job
        per_rank = self.cluster.gather({"loss": loss.item(), **self.window.means(), **self.tracker.host_sample(),
                                        **self.method_figures, **job.gradients.figures(),
                                        "steps": job.recorder.take()})
        self.reporter.log_step(position.epoch, position.step, per_rank, lr=lr)
        self.window, self.method_figures = PhaseTotals(), {}

    def checkpoint(self, position: Position) -> None:
        """Taken at the step's boundary (collective). The last step's is written once evaluated, so that a relaunch
        with --resume auto has nothing to do."""
        job, step = self.job, position.step
        taken = job.checkpoints.capture(job.model, job.optimizer, job.method, position, self.tracker.parent_id,
                                        self.tracker.unsent(), job.gradients.state_dict())
        if step < job.info.total_steps:
            job.checkpoints.write(taken, step)
            job.fault.at(self.cluster.info.rank, "checkpointed")
            self.tracker.commit()
        else:
            self.final_checkpoint = taken

    def stop_for_requeue(self, position: Position, checkpointed: bool) -> None:
        """SIGUSR1 (or torchrun's SIGTERM) reached some rank: every rank checkpoints here, if the step was not, and
        stops for requeue."""
        job = self.job
        if not checkpointed:
            job.checkpoints.save(job.model, job.optimizer, job.method, position, self.tracker.parent_id,
                                 self.tracker.unsent(), job.gradients.state_dict())
            self.tracker.commit()
        if job.preemption.received == signals.name(signals.TERMINATE):
            why = (f"{job.preemption.received} from torchrun's agent received (a node joined or left, or torchrun is "
                   f"stopping): checkpointed at step {position.step} and stopped")
        else:
            why = f"{preemption.SIGNAL.name} received: checkpointed at step {position.step} and stopped for requeue"
        self.requeued = f"{why} (exit status {REQUEUE_EXIT}); --resume auto continues from there"

    def count(self, read: list[StepTimes]) -> None:
        """Steps' phase times into the run's, the steady state's and the logging window's totals."""
        for step, times in read:
            self.run_totals.add(times)
            if step - self.first_step > self.config.timing_warmup_steps:
                self.after_warmup.add(times)
            self.window.add(times)

    def drain(self) -> None:
        """The steps the clock has not read yet (the last one, on a GPU), before the run's figures are made."""
        self.count(self.clock.drain())

    def divergence_message(self) -> str:
        """The paragraph that ends a diverged job: the step, the ranks, the last finite loss, the checkpoint kept."""
        settings, folder = self.config.optimizer_settings, self.job.checkpoints.folder
        latest = list_checkpoints(folder)[-1:] if folder else []
        return self.diverged.message(settings.lr, settings.warmup_steps, folder is not None,
                                     latest[0] if latest else None)
