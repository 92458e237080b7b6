"""The training job on every rank, read top to bottom: set up, each epoch's steps and score, the finish. Its parts
are in loop/: the setup (job.py), one step (train_step.py), what a finished step owes (after_step.py), the score."""

from __future__ import annotations

import sys
import time

import torch.distributed as dist

from . import advice, tracking
from .checkpoint import Position, restore_rank_state
from .clock import StepClock
from .cluster import Cluster
from .config import RESUME_AUTO, TrainConfig
from .errors import UserError, format_error
from .loop.after_step import AfterStep, PhaseTotals
from .loop.job import Job, samples_per_step, setup
from .loop.replicas import check_replicas_agree, parameter_digest, seed_everything
from .loop.scoring import Progress, evaluate, score
from .loop.train_step import train_step
from .memory import held_bytes
from .netmodel.memory import predict_memory
from .optimizers import state_slots
from .preemption import REQUEUE_EXIT
from .reporter import Reporter, SilentReporter
from .step.compiling import graphs_compiled
from .sync import REPLICATED_VIEW, WHOLE_VIEW, label
from .throughput import Throughput
from .timeline import step_events

# the loop's parts, by the names the tests and scripts import them from here
__all__ = ["AfterStep", "Job", "PhaseTotals", "Progress", "check_replicas_agree", "evaluate", "parameter_digest",
           "run", "score", "seed_everything", "setup", "train_step"]


def run(config: TrainConfig, cluster: Cluster) -> int:
    """One training job on every rank of `cluster`; its exit status (REQUEUE_EXIT: stopped by SIGUSR1 to be
    requeued, see preemption.py)."""
    # --sync auto: the advised flags, before anything is built
    config, advised = advice.resolve(config, cluster)
    job = setup(config, cluster, advised)
    compiled_at_setup = graphs_compiled() if config.compile else 0
    if job.resume and job.resume.finished(job.info.total_steps):
        return nothing_left(job, cluster, config.save_model)
    tracker = tracking.start(job.connection, config, cluster, job.info, job.preemption)
    reporter = make_reporter(config, cluster, job, tracker)
    # a host that went silent and came back, when the job spans hosts
    cluster.liveness.on_stall(reporter.note_stall)

    # The tracker ends the MLflow runs FINISHED, FAILED (any rank raised) or KILLED (SIGTERM/SIGINT); the reporter
    # ends its progress bar, if it draws one, before any message that follows.
    with tracker, reporter, job.method.explaining():
        if job.resume and config.resume == RESUME_AUTO:
            tracker.resend(job.resume.unsent_metrics)
        reporter.start(job.info)
        loop = Loop(config=config, cluster=cluster, job=job, reporter=reporter, tracker=tracker)
        for epoch in range(loop.start.epoch, config.epochs + 1):
            if loop.step >= job.info.total_steps:
                break
            loop.train_epoch(epoch)
            if loop.after_step.stopped:
                break
            loop.score_epoch(epoch)

        reporter.end_progress()
        if loop.after_step.diverged:
            message = loop.report_divergence()
        elif loop.after_step.requeued:
            loop.report_requeue()
        else:
            loop.finish(compiled_at_setup)

    # what rank 0 could not write at the end (a disk that filled), its runs FINISHED. Rank 0 alone exits with it: the
    # others are not held for it, as its last writes to a server that hangs may outlast --timeout
    ended = not (loop.after_step.diverged or loop.after_step.requeued)
    unwritten = reporter.unwritten() if ended else None
    # a requeued job's ranks leave together; the process group closes last
    if loop.after_step.requeued:
        job.preemption.leave_together()
    job.preemption.close()
    dist.destroy_process_group()
    # every rank raises it alike, its runs already ended FAILED: rank 0 prints it, exit status 2
    if loop.after_step.diverged:
        raise UserError(message)
    if unwritten:
        print(format_error(unwritten), file=sys.stderr, flush=True)
        return UserError.exit_code
    return REQUEUE_EXIT if loop.after_step.requeued else 0


def nothing_left(job: Job, cluster: Cluster, save_model: bool = False) -> int:
    """A relaunch (--resume auto) of a job whose checkpoint is its last step's, evaluated already: nothing to do.
    `save_model`: say where the trained weights are, as no model is saved without a job's end."""
    if cluster.info.is_main:
        print(f"mpi_train: {job.resume.path} is at step {job.resume.position.step}, this job's last is "
              f"{job.info.total_steps}: it has finished (and been evaluated) already, nothing to do.", flush=True)
        if save_model:
            print(f"mpi_train: warning: --save-model logs the model a job ends with, and this one trains no step, so "
                  f"no model is saved. Its weights are the checkpoint's: torch.load(\"{job.resume.path}\", "
                  f"weights_only=True)[\"model_state\"] is the state_dict of the job's --model.", file=sys.stderr,
                  flush=True)
    dist.destroy_process_group()
    return 0


def make_reporter(config: TrainConfig, cluster: Cluster, job: Job, tracker: tracking.NullTracker) -> SilentReporter:
    """Rank 0's console, summary file and MLflow runs; the other ranks report nothing."""
    if not cluster.info.is_main:
        return SilentReporter()
    first_step = job.resume.position.step if job.resume else 0
    world = cluster.info.world_size
    return Reporter(config_dict=config.as_dict(), samples_per_step=samples_per_step(config, job.sampler, world),
                    summary_path=config.summary_json, tracker=tracker, sync_model=job.sync_model,
                    steady_from=first_step + config.timing_warmup_steps, name=config.default_run_name(world),
                    alignments=job.alignments,
                    throughput=Throughput.of(config.make_model, config.input_shape, job.device,
                                             tokens=config.language_model, precision=job.precision.name))


class Loop:
    """Where training stands on this rank between its epochs: the step reached, the bytes sent, the wall time, and
    what each step owes after it (AfterStep)."""

    def __init__(self, config: TrainConfig, cluster: Cluster, job: Job, reporter: SilentReporter,
                 tracker: tracking.NullTracker):
        self.config, self.cluster, self.job, self.reporter, self.tracker = config, cluster, job, reporter, tracker
        self.clock = StepClock(job.device)
        self.after_step = AfterStep(config=config, cluster=cluster, job=job, clock=self.clock, reporter=reporter,
                                    tracker=tracker)
        self.started = time.perf_counter()
        self.start = job.resume.position if job.resume else Position()
        self.step, self.sent = self.start.step, self.start.sent_bytes
        self.progress = Progress(self.start.elapsed_s)
        self.epoch_started = self.started

    def train_epoch(self, epoch: int) -> None:
        """The epoch's steps, a resumed epoch's from where its checkpoint left it, each followed by what it owes,
        with --eval-every's scores between them; it ends early when a step stops the job."""
        config, job, rank = self.config, self.job, self.cluster.info.rank
        job.sampler.set_epoch(epoch - 1)
        step_in_epoch = self.start.step_in_epoch if epoch == self.start.epoch else 0
        # a resumed epoch skips the batches already trained on
        job.sampler.skip_next(step_in_epoch * job.info.batch_size_per_rank)
        self.epoch_started = time.perf_counter()
        batches = iter(job.train_loader)
        # each rank's random state from the checkpoint, after iter(): it draws a seed from torch's generator
        if job.resume and epoch == self.start.epoch:
            self.restore_rank_state()
        while self.step < job.info.total_steps and step_in_epoch < job.info.steps_per_epoch:
            # a batch is left: fail here, if told to; a rank whose collective times out names who is behind
            job.fault.at(rank, self.step + 1)
            self.cluster.note_progress(self.step + 1)
            done = train_step(job, batches, self.clock, self.step + 1, rank, config.accumulate)
            if done is None:
                break
            self.step, step_in_epoch = self.step + 1, step_in_epoch + 1
            self.sent += job.sent_per_sync.get(done[-1].scope, 0.0)
            position = Position(epoch=epoch, step=self.step, step_in_epoch=step_in_epoch,
                                elapsed_s=self.progress.elapsed(), sent_bytes=self.sent)
            self.reporter.advance(epoch, self.step)
            stops = self.after_step(position, *done)
            if stops:
                break
            if self.scored_mid_epoch(step_in_epoch):
                self.cluster.note_progress(self.step + 0.5)
                with self.progress.evaluating():
                    self.reporter.log_eval(self.step, *score(job, self.cluster), position.elapsed_s, self.sent)

    def restore_rank_state(self) -> None:
        """Each rank's random state from the checkpoint, and its sync method's when the same method wrote it for
        the same number of ranks."""
        resume, config = self.job.resume, self.config
        same = (resume.method == label(config.sync, config.compression)
                and not resume.resharded(self.cluster.info.world_size))
        restore_rank_state(resume.rank_state, self.job.model, self.job.method if same else None)

    def scored_mid_epoch(self, step_in_epoch: int) -> bool:
        """--eval-every's steps before the last; an epoch's end is scored by score_epoch."""
        every, info = self.config.eval_every, self.job.info
        return bool(every and self.step % every == 0 and self.step < info.total_steps
                    and step_in_epoch < info.steps_per_epoch)

    def score_epoch(self, epoch: int) -> None:
        """The epoch's test loss and accuracy, after the last step has made the ranks' models one (for a method
        whose ranks train their own)."""
        job = self.job
        if self.step >= job.info.total_steps:
            merged = job.method.finish(job.model)
            if merged:
                self.sent += job.sent_per_sync["all"]
        job.fault.at(self.cluster.info.rank, "eval")
        # past step `step`'s sync, not yet at the next one's
        self.cluster.note_progress(self.step + 0.5)
        elapsed = self.progress.elapsed()
        with self.progress.evaluating():
            test_loss, test_accuracy = score(job, self.cluster)
        self.reporter.log_epoch(epoch, self.step, test_loss, test_accuracy, time.perf_counter() - self.epoch_started)
        self.reporter.log_eval(self.step, test_loss, test_accuracy, elapsed, self.sent, epoch_end=True)

    def report_divergence(self) -> str:
        """A step went inf or NaN: the MLflow runs end FAILED with the message every rank then raises."""
        self.cluster.liveness.close()
        diverged = self.after_step.diverged
        message = self.after_step.divergence_message()
        self.tracker.diverged(diverged.step, diverged.first_rank, message)
        return message

    def report_requeue(self) -> None:
        """SIGUSR1 stopped the job, checkpointed, for requeue."""
        self.cluster.liveness.close()
        self.tracker.requeue(self.after_step.requeued)
        if self.cluster.info.is_main:
            print(f"mpi_train: {self.after_step.requeued}", flush=True)

    def finish(self, compiled_at_setup: int) -> None:
        """The last step done: its times read, the replicas checked, the final checkpoint written once scored, the
        timeline, memory and summary reported, the weights saved."""
        config, cluster, job, after_step = self.config, self.cluster, self.job, self.after_step
        after_step.drain()
        check_replicas_agree(cluster, job.method.tensors(job.model, REPLICATED_VIEW), f"after step {self.step}")
        if job.checkpoints.due(self.step, job.info.total_steps) and self.step > after_step.first_step:
            job.checkpoints.write(after_step.final_checkpoint, self.step)
            self.tracker.commit()
        if config.timeline_window:
            self.save_timeline()
        # from here ranks may leave at different times: a silent host is no news
        cluster.liveness.close()
        self.report_run(compiled_at_setup)
        if config.save_model:
            self.reporter.save_weights(job.method.save(job.model)["model"])

    def save_timeline(self) -> None:
        """Every rank's recorded steps (collective), drawn and written by rank 0."""
        job, rank = self.job, self.cluster.info.rank
        names = [name for name, p in job.model.named_parameters() if p.requires_grad]
        events = step_events(rank, job.recorder.kept, job.recorder.alignment.offset_s, names)
        self.reporter.save_timeline(self.cluster.gather(events), job.alignments, job.recorder, job.method)

    def report_run(self, compiled_at_setup: int) -> None:
        """The run's memory, compiles after setup and summary, from every rank's figures (collective)."""
        config, cluster, job, after_step = self.config, self.cluster, self.job, self.after_step
        # the steps after --timing-warmup-steps, or every step of a job too short to leave any out
        warm = after_step.after_warmup.steps > 0
        steady = after_step.after_warmup if warm else after_step.run_totals
        # collective for a sharding method
        digest = parameter_digest(job.method.tensors(job.model, WHOLE_VIEW))
        self.reporter.memory(cluster.gather(held_bytes(job.model, job.optimizer, job.method, job.memory_before)),
                             predict_memory(job.method, job.model, cluster.info.world_size,
                                            state_slots(config.optimizer_settings)))
        if config.compile:
            self.reporter.compiled_after_setup(graphs_compiled() - compiled_at_setup)
        self.reporter.finish(cluster.gather(after_step.run_totals.means()), time.perf_counter() - self.started,
                             cluster.gather(steady.means()), config.timing_warmup_steps if warm else 0,
                             cluster.gather(job.recorder.busy_s),
                             weights_sha256=digest if cluster.info.is_main else None)
