"""The training job: set up, then forward, backward, sync, step, with each phase timed on every rank."""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import advice, preemption, tracking
from .checkpoint import Checkpointer, Position, Resume, list_checkpoints, load_for_resume, restore_rank_state
from .clock import StepClock
from .cluster import Cluster
from .config import RESUME_AUTO, JobInfo, TrainConfig
from .data import load_datasets, make_loaders
from .data.text import zero_windows
from .devices import place, run_shapes, warm_autotuner
from .errors import UserError
from .failpoints import injected, overflowing, slowed
from .lr_schedule import LearningRate
from .memory import count_peak_from_here, held_bytes
from .netmodel import JobModel, bytes_sent_per_sync, job_model, layout_params
from .netmodel.memory import predict_memory
from .optimizers import OPTIMIZERS, state_slots
from .preemption import REQUEUE_EXIT, Divergence, Preemption, StepAgreement
from .randomness import seed_rank_streams
from .reporter import PHASES, Reporter, SilentReporter, check_outputs
from .step.compiling import compile_net, graphs_compiled, shared_sizes, toolchain_error, wants_channels_last
from .step.gradients import OptimizerGradients
from .step.precision import PRECISIONS, Precision
from .step.precision import agreed as agreed_precision
from .sync import SYNC_METHODS, SyncMethod, backend_error, label
from .throughput import Throughput
from .timeline import Alignment, StepRecorder, align_clocks, step_events


def seed_everything(seed: int) -> None:
    """The same seed on every rank, before the model is built, so replicas start identical."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def parameter_digest(tensors: nn.Module | list[torch.Tensor]) -> str:
    """A hash of every parameter's (or tensor's) exact bytes: equal digests mean identical replicas."""
    digest = hashlib.sha256()
    for tensor in tensors.parameters() if isinstance(tensors, nn.Module) else tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def check_replicas_agree(cluster: Cluster, model: nn.Module | list[torch.Tensor], when: str) -> None:
    """Compare every rank's parameter digest with rank 0's (or of the tensors a sync method keeps equal: local SGD's
    last average); collective."""
    digests = cluster.allgather(parameter_digest(model))
    differing = [rank for rank, d in enumerate(digests) if d != digests[0]]
    if differing:
        raise UserError(
            f"{when}, rank(s) {differing} hold different weights from rank 0. Every rank must run "
            f"the same code, torch version and --seed; a sync method that does not average every "
            f"gradient also causes this."
        )


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


def evaluate(model: nn.Module, loader, device: torch.device, cluster: Cluster,
             precision: Precision = PRECISIONS["32-true"]) -> tuple[float, float]:
    """Test loss and accuracy over the whole test set: each rank scores its shard, then the sums are reduced. The
    forward runs at the job's precision, as training's does; the loss in float32."""
    model.eval()
    totals = np.zeros(3)  # loss sum, correct, count
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            with precision.autocast(device):
                logits = model(images).float()
                summed = F.cross_entropy(logits, labels, reduction="sum")
            totals += (summed.item(),
                       (logits.argmax(1) == labels).sum().item(), len(labels))
    model.train()
    reduced = torch.tensor(totals, dtype=torch.float64, device=device)
    if cluster.info.world_size > 1:
        dist.all_reduce(reduced)  # the process group's timeout covers a peer stuck in its own evaluation
    loss_sum, correct, count = reduced.tolist()
    return loss_sum / count, correct / count


@dataclass
class Job:
    """What setup builds on every rank, ready for the loop."""

    info: JobInfo
    device: torch.device
    model: nn.Module  # the replica whose weights are checked, checkpointed and synced
    net: nn.Module  # what the forward pass runs: the model, or the sync method's wrapper around it
    method: SyncMethod
    optimizer: torch.optim.Optimizer
    learning_rate: LearningRate
    sync_model: JobModel | None  # the sync time the alpha-beta model expects (None on one host)
    train_loader: Any
    sampler: Any
    test_loader: Any
    checkpoints: Checkpointer
    resume: Resume | None
    preemption: Preemption  # SIGUSR1: checkpoint at the next step boundary and stop for requeue
    agreement: StepAgreement  # what every rank decides alike after each step: SIGUSR1, a loss or weights gone inf/NaN
    connection: tracking.Connection | None
    fault: Any
    slow: Any  # a simulated straggler ($MPI_TRAIN_SLOW), or nothing
    recorder: StepRecorder  # each step's arrival, sync region and messages; a timeline's everything
    alignments: list[Alignment] | None  # every rank's clock offset to rank 0's (on rank 0)
    sent_per_sync: dict  # bytes this rank sends per sync, by what the step synced (method.last_sync)
    memory_before: int  # CUDA bytes allocated when the job began (memory.count_peak_from_here; 0 on a CPU)
    precision: Precision  # --precision as it runs on this device (auto resolved)
    gradients: OptimizerGradients  # between sync and optimizer step: 16-mixed's loss scale, --clip-grad-norm
    overflow: Any  # a forced float16 overflow ($MPI_TRAIN_OVERFLOW_AT, 16-mixed only), or nothing


def score(job: Job, cluster: Cluster) -> tuple[float, float]:
    """Test loss and accuracy of the model the job stands for (collective): buffers averaged, and for a method whose
    ranks hold their own models between averages, their mean (training goes on with each rank's own). Iterating the
    test loader draws a seed from torch's generator: its state is put back, so that scoring (--eval-every) leaves
    training's random draws, and so its losses, as they were."""
    job.method.sync_buffers(job.model)
    random_state = torch.get_rng_state()
    try:
        with job.method.evaluated(job.model):
            return evaluate(job.model, job.test_loader, job.device, cluster, job.precision)
    finally:
        torch.set_rng_state(random_state)


class Progress:
    """The job's wall time spent training, its test evaluations left out (time to accuracy), from where a resumed
    job's checkpoint left it."""

    def __init__(self, elapsed_s: float = 0.0):
        self.started, self.before, self.evaluating_s = time.perf_counter(), elapsed_s, 0.0

    def elapsed(self) -> float:
        return self.before + time.perf_counter() - self.started - self.evaluating_s

    @contextlib.contextmanager
    def evaluating(self):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.evaluating_s += time.perf_counter() - began


def setup(config: TrainConfig, cluster: Cluster, advised: dict | None = None) -> Job:
    """Tracking store, threads and device, data, process group, identical replicas, sync method, optimizer, resume.
    `advised`: the advice --sync auto followed (advice.resolve), reported with the job."""
    info = cluster.info
    config.validate(info.world_size)
    check_outputs(config, cluster)  # rank 0 checks every path the job writes, before any work
    connection = tracking.connect(config, cluster)  # rank 0 checks the tracking store now, before any work
    fault = injected()  # a no-op unless a test names a failure to inject
    slow = slowed()  # and a no-op unless a test or demo names a rank to slow down
    fault.at(info.rank, "start")
    placement = place(cluster, config.backend, config.threads, config.deterministic)
    unsupported = backend_error(config.sync, placement.backend)
    if unsupported:  # before any collective: torch's own failure would abort the process
        raise UserError(unsupported)
    device = placement.device
    precision = agreed_precision(config.precision, device, cluster)  # auto resolved; a device without it refused
    if config.compile:  # every rank's own toolchain, refused alike before any data is read
        cluster.agree(toolchain_error(device, config.compile_mode), "--compile cannot build its kernels")
    memory_before = count_peak_from_here(device)  # this job's own CUDA peak, in a process that runs several

    train_set, test_set = load_datasets(config, cluster)
    batch_per_rank = config.per_rank(info.world_size)
    loaders = make_loaders(train_set, test_set, config, cluster, device, placement.threads)
    fault.at(info.rank, "rendezvous")
    rendezvous = cluster.open_process_group(placement.backend, config.master_addr, config.timeout, device)

    seed_everything(config.seed)
    model = config.make_model().to(device)
    check_replicas_agree(cluster, model, "at start")
    tokens = torch.int64 if config.language_model else None
    if not config.compile:  # (a compiled job's warm-up meets every shape, in the layout its graphs run)
        # under the job's autocast: a bfloat16 convolution is another kernel to tune than a float32 one (an H200's
        # CIFAR-10 epoch in bf16-mixed paid 2.7 s of tuning mid-epoch when the warm-up ran in float32)
        warm_autotuner(model, config.input_shape, *loaders.batch_sizes, device, tokens,
                       computing=lambda: precision.autocast(device))
    seed_rank_streams(config.seed, info.rank)  # dropout (and the DataLoader path's augmentation): each rank's own
    method = SYNC_METHODS[config.sync].from_config(config)
    if config.compile and wants_channels_last(model, device, method):  # before a wrapper lays out its buckets or shards
        model.to(memory_format=torch.channels_last)
    net = method.wrap(model)
    compile_s = None
    if config.compile:  # every rank runs the same shapes: a wrapper's collectives in the warm-up pair up
        windows = partial(zero_windows, context=config.input_shape[0], device=device) if config.language_model else None
        shapes = partial(run_shapes, net, model, config.input_shape, *shared_sizes(cluster, loaders.batch_sizes),
                         device, tokens, scoring=method.evaluated(model), make_input=windows,
                         computing=partial(precision.autocast, device))
        compile_s = max(cluster.allgather(compile_net(net, model, method, config.compile_mode, device, shapes)))
    alignment, alignments = align_clocks(cluster, device) if info.world_size > 1 else (Alignment(), [Alignment()])
    recorder = StepRecorder(alignment, method.overlapped(), config.timeline_window, gpu=device.type == "cuda")
    recorder.watch(model)
    method.record_into(recorder)
    sync_model = job_model(config, cluster, model, method, device)
    settings = config.optimizer_settings  # the flags given, else the model's defaults
    optimizer = method.make_optimizer(model, lambda params: OPTIMIZERS[settings.optimizer].build(params, settings))
    method.use_optimizer(optimizer)

    steps_per_epoch = len(loaders.train) // config.accumulate  # optimizer steps: K micro-batches each
    total_steps = min(config.epochs * steps_per_epoch, config.max_steps or float("inf"))
    checkpoints = Checkpointer(config, cluster)
    resume = load_for_resume(config, cluster, total_steps)
    # the weights and momentum of the checkpoint; each rank's random state comes right before its first batch
    gradients = OptimizerGradients(precision, method, optimizer, config.clip_grad_norm, device, info.world_size)
    if resume:
        method.load_model_state(model, resume.model_state)
        method.load_optimizer_state(optimizer, resume.optimizer_state, model)  # a sharding method keeps its shard
        method.start_at(resume.position.step)
        gradients.load_state_dict(resume.loss_scaler)  # the same on every rank: it was agreed at every step
    schedule_steps = config.epochs * steps_per_epoch  # the whole run's, so --max-steps and resuming keep the same curve
    learning_rate = LearningRate(optimizer, settings.lr, config.lr_schedule, settings.warmup_steps, schedule_steps,
                                 steps_done=resume.position.step if resume else 0)
    job = JobInfo(
        world_size=info.world_size, backend=placement.backend, hosts=tuple(cluster.hosts), threads=placement.threads,
        rendezvous=rendezvous, batch_size_per_rank=batch_per_rank, steps_per_epoch=steps_per_epoch,
        total_steps=total_steps, compression=SYNC_METHODS[config.sync].compression_name(config.compression),
        **layout_params(cluster.hosts),
        resumed_from=({"checkpoint": str(resume.path), "step": resume.position.step, "run_id": resume.parent_run_id,
                       "world_size": resume.world_size} if resume else None),
        advice=advised, data_path=loaders.describe(), compile_s=compile_s,
        precision=precision.name,
    )
    preemption = Preemption(config.checkpoint_dir is not None, info.world_size)
    agreement = StepAgreement(preemption, info.rank, info.world_size, device)
    return Job(job, device, model, net, method, optimizer, learning_rate, sync_model, loaders.train, loaders.sampler,
               loaders.test, checkpoints, resume, preemption, agreement, connection, fault, slow, recorder, alignments,
               bytes_sent_per_sync(method, model, list(cluster.hosts), info.rank), memory_before,
               precision=precision, gradients=gradients, overflow=overflowing(model, precision.scaled))


def train_step(job: Job, batches, clock: StepClock, step: int, rank: int,
               accumulate: int = 1) -> tuple[torch.Tensor, float, list[tuple[int, dict]]] | None:
    """Data, forward and backward (of `accumulate` micro-batches, their gradients added up, nothing sent before the
    last), sync, optimizer step; the loss, the step's learning rate and the phase times of the steps the clock has
    read so far, (step, times) each: this one on CPUs, the one before on a GPU (None: the epoch is over). The clock
    marks the phases' boundaries (forward apart from backward only in a timeline); with micro-batches, data time is
    their loading and compute the rest up to the sync."""
    job.recorder.begin(step)
    job.overflow.at(rank, step)
    begun = clock.start()
    job.optimizer.zero_grad(set_to_none=True)
    loads, loss = [], 0.0
    for micro in range(accumulate):
        loading = clock.mark() if micro else begun  # zero_grad queued nothing: a mark fewer for the host to make
        batch = next(batches, None)
        if batch is None:
            return None
        images, labels = batch[0].to(job.device, non_blocking=True), batch[1].to(job.device, non_blocking=True)
        loads.append((loading, clock.mark()))
        last = micro == accumulate - 1
        with contextlib.nullcontext() if last else job.method.accumulating(job.net):
            with job.precision.autocast(job.device):  # forward and loss; backward outside it, as torch advises
                micro_loss = F.cross_entropy(job.net(images).float(), labels)
            if last:
                job.slow.at(rank)  # a simulated straggler computes longer, before its last gradients are ready
            forward_end = clock.mark() if job.recorder.detailed else loads[-1][1]
            job.gradients.scaled(micro_loss / accumulate if accumulate > 1 else micro_loss).backward()
        loss = loss + micro_loss.detach() / accumulate if accumulate > 1 else micro_loss
    computed = clock.mark()
    job.method.sync(job.model)
    synced = clock.mark()
    if job.gradients.ready():  # unscaled, clipped; an overflow on any rank skips the update on every rank
        job.optimizer.step()
    stepped = clock.mark()
    # a model-averaging method's average, when due: its sync region, after the optimizer's
    averaged = job.method.after_step(job.model)
    ended = clock.mark() if averaged else stepped
    record = job.recorder.current

    def phases(at: list[float]) -> tuple[int, dict]:
        t0 = at[begun]
        t1 = t0 + sum(at[loaded] - at[loading] for loading, loaded in loads)  # the phases as one step's: loading first
        t2, t3, t4, t5 = at[computed], at[synced], at[stepped], at[ended]
        job.recorder.end((t0, t1, at[forward_end], t2, t3, t4, t5), sync=(t4, t5) if averaged else (t2, t3),
                         step=record)
        return step, {"data_time_s": t1 - t0, "compute_time_s": t2 - t1, "sync_time_s": (t3 - t2) + (t5 - t4),
                      "optimizer_time_s": t4 - t3, "step_time_s": t5 - t0}

    read = clock.close(phases)
    lr = job.learning_rate.current
    job.learning_rate.step()
    return loss, lr, read


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

    def __call__(self, position: Position, loss: torch.Tensor, lr: float, read: list[tuple[int, dict]]) -> bool:
        """True when the job stops here: for requeue (preemption.py), or because training diverged. `read`: the
        phase times of the steps the clock has read (on a GPU, the step before this one); a logged step reads this
        one's too."""
        config, step, total_steps = self.config, position.step, self.job.info.total_steps
        checked = bool(config.check_every and step % config.check_every == 0)
        logged = step % config.log_every == 0 or step == total_steps or step % self.job.info.steps_per_epoch == 0
        scored = bool(config.eval_every and step % config.eval_every == 0)
        due = self.job.checkpoints.due(step, total_steps)
        # Every rank's loss, and SIGUSR1, in one all-reduce a step. On a GPU its answer is read a step late, unless
        # the host waits for this step anyway: no step gone inf or NaN is logged, checked, scored or checkpointed,
        # and every rank stops at the same step. A step that is checkpointed shares its weights' norm too, so that
        # no checkpoint holds weights an update left inf or NaN with the loss still finite; elsewhere the next
        # step's loss tells, and a norm over every weight each step would cost a large model more than it saves.
        # The weights are those the optimizer steps: zero's model takes in its updated shard in the next forward.
        agreement = self.job.agreement
        weights = [param for group in self.job.optimizer.param_groups for param in group["params"]] if due else []
        agreement.post(step, loss, weights)
        agreement.read(wait=logged or checked or scored or due)
        if agreement.diverged:
            self.diverged = agreement.diverged
            return True
        if checked:
            check_replicas_agree(self.cluster, self.job.method.replicated(self.job.model), f"at step {step}")
        self.count(read + (self.clock.drain() if logged else []))
        if logged:
            per_rank = self.cluster.gather({"loss": loss.item(), **self.window.means(), **self.tracker.host_sample(),
                                            **self.job.method.figures(), **self.job.gradients.figures(),
                                            "steps": self.job.recorder.take()})
            self.reporter.log_step(position.epoch, step, total_steps, per_rank, lr=lr)
            self.window = PhaseTotals()
        if due:
            taken = self.job.checkpoints.capture(self.job.model, self.job.optimizer, self.job.method, position,
                                                 self.tracker.parent_id, self.tracker.unsent(),
                                                 self.job.gradients.state_dict())
            if step < total_steps:
                self.job.checkpoints.write(taken, step)
                self.job.fault.at(self.cluster.info.rank, "checkpointed")
                self.tracker.commit()
            else:  # the end's: written once evaluated, so a relaunch with --resume auto has nothing to do
                self.final_checkpoint = taken
        if step < total_steps and agreement.signalled:  # SIGUSR1 on some rank: stop here, checkpointed
            if not due:
                self.job.checkpoints.save(self.job.model, self.job.optimizer, self.job.method, position,
                                          self.tracker.parent_id, self.tracker.unsent(),
                                          self.job.gradients.state_dict())
                self.tracker.commit()
            self.requeued = (f"{preemption.SIGNAL.name} received: checkpointed at step {step} and stopped for "
                             f"requeue (exit status {REQUEUE_EXIT}); --resume auto continues from there")
        return bool(self.requeued)

    def count(self, read: list[tuple[int, dict]]) -> None:
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


def run(config: TrainConfig, cluster: Cluster) -> int:
    """One training job on every rank of `cluster`; its exit status (REQUEUE_EXIT: stopped by SIGUSR1 to be
    requeued, see preemption.py)."""
    config, advised = advice.resolve(config, cluster)  # --sync auto: the advised flags, before anything is built
    job = setup(config, cluster, advised)
    compiled_at_setup = graphs_compiled() if config.compile else 0
    rank, total_steps = cluster.info.rank, job.info.total_steps
    if job.resume and job.resume.finished(total_steps):
        if cluster.info.is_main:
            print(f"mpi_train: {job.resume.path} is at step {job.resume.position.step}, this job's last is "
                  f"{total_steps}: it has finished (and been evaluated) already, nothing to do.", flush=True)
        dist.destroy_process_group()
        return 0
    tracker = tracking.start(job.connection, config, cluster, job.info)
    first_step = job.resume.position.step if job.resume else 0
    reporter = Reporter(config.as_dict(), config.batch_size, config.summary_json, tracker=tracker,
                        sync_model=job.sync_model, steady_from=first_step + config.timing_warmup_steps,
                        name=config.default_run_name(cluster.info.world_size),
                        alignments=job.alignments,
                        throughput=Throughput.of(config.make_model, config.input_shape, job.device,
                                                 tokens=config.language_model, precision=job.precision.name),
                        ) if cluster.info.is_main else SilentReporter()
    cluster.liveness.on_stall(reporter.note_stall)  # a host that went silent and came back, when the job spans hosts
    # the tracker ends the MLflow runs FINISHED, FAILED (any rank raised) or KILLED (SIGTERM/SIGINT); the reporter
    # ends its progress bar, if it draws one, before any message that follows
    with tracker, reporter:
        if job.resume and config.resume == RESUME_AUTO:
            tracker.resend(job.resume.unsent_metrics)
        reporter.start(job.info)
        clock = StepClock(job.device)
        after_step = AfterStep(config, cluster, job, clock, reporter, tracker)
        started = time.perf_counter()
        start = job.resume.position if job.resume else Position()
        step, sent, progress = start.step, start.sent_bytes, Progress(start.elapsed_s)
        for epoch in range(start.epoch, config.epochs + 1):
            if step >= total_steps:
                break
            job.sampler.set_epoch(epoch - 1)
            step_in_epoch = start.step_in_epoch if epoch == start.epoch else 0
            # a resumed epoch skips the batches already trained on
            job.sampler.skip_next(step_in_epoch * job.info.batch_size_per_rank)
            epoch_started = time.perf_counter()
            batches = iter(job.train_loader)
            if job.resume and epoch == start.epoch:
                # after iter(): it draws a seed from torch's generator
                same = (job.resume.method == label(config.sync, config.compression)
                        and not job.resume.resharded(cluster.info.world_size))
                restore_rank_state(job.resume.rank_state, job.model, job.method if same else None)
            # a batch is left: fail here, if told to
            while step < total_steps and step_in_epoch < job.info.steps_per_epoch:
                job.fault.at(rank, step + 1)
                cluster.note_progress(step + 1)  # lets a rank whose collective times out name who is behind
                done = train_step(job, batches, clock, step + 1, rank, config.accumulate)
                if done is None:
                    break
                step, step_in_epoch = step + 1, step_in_epoch + 1
                sent += job.sent_per_sync.get(job.method.last_sync, 0.0)
                position = Position(epoch, step, step_in_epoch, progress.elapsed(), sent)
                reporter.advance(epoch, step)
                if after_step(position, *done):
                    break
                if (config.eval_every and step % config.eval_every == 0 and step < total_steps
                        and step_in_epoch < job.info.steps_per_epoch):  # (an epoch's end is scored below)
                    with progress.evaluating():
                        reporter.log_eval(step, *score(job, cluster), position.elapsed_s, sent)
            if after_step.requeued or after_step.diverged:
                break

            if step >= total_steps and job.method.finish(job.model):  # the ranks' models made one, if they were not
                sent += job.sent_per_sync["all"]
            job.fault.at(rank, "eval")
            cluster.note_progress(step + 0.5)  # past step `step`'s sync, not yet at the next one's
            elapsed = progress.elapsed()
            with progress.evaluating():
                test_loss, test_accuracy = score(job, cluster)
            reporter.log_epoch(epoch, step, test_loss, test_accuracy, time.perf_counter() - epoch_started)
            reporter.log_eval(step, test_loss, test_accuracy, elapsed, sent, epoch_end=True)

        reporter.end_progress()
        if after_step.diverged:
            cluster.liveness.close()
            message = after_step.divergence_message()
            tracker.diverged(after_step.diverged.step, after_step.diverged.first_rank, message)
        elif after_step.requeued:
            cluster.liveness.close()
            tracker.requeue(after_step.requeued)
            if cluster.info.is_main:
                print(f"mpi_train: {after_step.requeued}", flush=True)
        else:
            after_step.drain()
            check_replicas_agree(cluster, job.method.replicated(job.model), f"after step {step}")
            if job.checkpoints.due(step, total_steps) and step > after_step.first_step:
                job.checkpoints.write(after_step.final_checkpoint, step)
                tracker.commit()
            if config.timeline_window:
                names = [name for name, p in job.model.named_parameters() if p.requires_grad]
                events = step_events(rank, job.recorder.kept, job.recorder.alignment.offset_s, names)
                reporter.save_timeline(cluster.gather(events), job.alignments, job.recorder, job.method)
            cluster.liveness.close()  # ranks may now leave at different times: silence is no longer news
            # a job too short to leave any out
            steady = after_step.after_warmup if after_step.after_warmup.steps else after_step.run_totals
            digest = parameter_digest(job.method.whole_parameters(job.model))  # collective for a sharding method
            reporter.memory(cluster.gather(held_bytes(job.model, job.optimizer, job.method, job.memory_before)),
                            predict_memory(job.method, job.model, cluster.info.world_size,
                                           state_slots(config.optimizer_settings)))
            if config.compile:
                reporter.compiled_after_setup(graphs_compiled() - compiled_at_setup)
            reporter.finish(cluster.gather(after_step.run_totals.means()), time.perf_counter() - started,
                            cluster.gather(steady.means()),
                            config.timing_warmup_steps if after_step.after_warmup.steps else 0,
                            cluster.gather(job.recorder.busy_s),
                            weights_sha256=digest if cluster.info.is_main else None)
            if config.save_model:
                reporter.save_weights(job.method.model_state(job.model))
    if after_step.requeued:
        job.preemption.leave_together()
    job.preemption.close()
    dist.destroy_process_group()
    if after_step.diverged:  # every rank raises it alike, its runs already FAILED: rank 0 prints it, exit status 2
        raise UserError(message)
    return REQUEUE_EXIT if after_step.requeued else 0
