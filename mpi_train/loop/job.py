"""Setting a job up on every rank: checks before any work, data, the process group, identical replicas wrapped by
their sync method, the optimizer, and a checkpoint's state when the job resumes one."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import nn

from .. import tracking
from ..checkpoint import Checkpointer, Resume, load_for_resume
from ..cluster import Cluster
from ..config import RESUME_AUTO, JobInfo, TrainConfig
from ..data import Loaders, load_datasets, make_loaders
from ..data.sampler import ResumableSampler
from ..data.text import zero_windows
from ..devices import Placement, place, run_shapes, warm_autotuner
from ..environments import ClusterEnvironment
from ..errors import UserError
from ..failpoints import injected, overflowing, slowed
from ..lr_schedule import LearningRate
from ..memory import count_peak_from_here
from ..models.sync_batchnorm import globalise_batchnorm
from ..netmodel import JobModel, bytes_sent_per_sync, job_model, layout_params
from ..optimizers import OPTIMIZERS
from ..preemption import Preemption, StepAgreement
from ..randomness import seed_rank_streams
from ..reporter import check_outputs
from ..same_job import check_same_settings
from ..step.compiling import compile_net, shared_sizes, toolchain_error, wants_channels_last
from ..step.gradients import OptimizerGradients
from ..step.precision import Precision, slow_on_cpu
from ..step.precision import agreed as agreed_precision
from ..sync import SYNC_METHODS, SyncMethod, backend_error, build_method, label
from ..timeline import Alignment, StepRecorder, align_clocks
from .replicas import BUILT_APART, check_replicas_agree, seed_everything


@dataclass(frozen=True)
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
    preemption: Preemption  # SIGUSR1 (torchrun's SIGTERM): checkpoint at the next step boundary and stop
    agreement: StepAgreement  # what every rank decides alike after each step: SIGUSR1, a loss or weights gone inf/NaN
    connection: tracking.Connection | None
    fault: Any
    slow: Any  # a simulated straggler ($MPI_TRAIN_SLOW), or nothing
    recorder: StepRecorder  # each step's arrival, sync region and messages; a timeline's everything
    alignments: list[Alignment] | None  # every rank's clock offset to rank 0's (on rank 0)
    sent_per_sync: dict  # bytes this rank sends per sync, by what the step synced (Synced.scope)
    memory_before: int  # CUDA bytes allocated when the job began (0 on a CPU)
    precision: Precision  # --precision as it runs on this device (auto resolved)
    gradients: OptimizerGradients  # between sync and optimizer step: 16-mixed's loss scale, --clip-grad-norm
    overflow: Any  # a forced float16 overflow ($MPI_TRAIN_OVERFLOW_AT, 16-mixed only), or nothing


@dataclass(frozen=True)
class Replica:
    """This rank's copy of the model, as its sync method wraps it for the forward pass."""

    model: nn.Module
    method: SyncMethod
    net: nn.Module
    compile_s: float | None  # under --compile: the slowest rank's compile


def setup(config: TrainConfig, cluster: Cluster, advised: dict | None = None) -> Job:
    """Tracking store, threads and device, data, process group, identical replicas, sync method, optimizer, resume.
    `advised`: the advice --sync auto followed (advice.resolve), reported with the job."""
    info = cluster.info
    config = resized_by_launcher(config, cluster.environment)
    check_same_settings(config.as_dict(), cluster)  # before the checks, which may refuse one rank's alone
    config.validate(info.world_size)
    untrained = config.untrained_parameters  # a model with nothing to train refused here, before any work
    # rank 0 checks every path the job writes, and the tracking store, before any work
    check_outputs(config, cluster)
    connection = tracking.connect(config, cluster)
    # no-ops unless a test names a failure to inject, or a rank to slow down
    fault, slow = injected(), slowed()
    fault.at(info.rank, "start")
    placement, precision = placed(config, cluster)
    device = placement.device
    # this job's own CUDA peak, in a process that runs several
    memory_before = count_peak_from_here(device)

    train_set, test_set = load_datasets(config, cluster)
    loaders = make_loaders(train_set, test_set, config, cluster, device, placement.threads)
    fault.at(info.rank, "rendezvous")
    rendezvous = cluster.open_process_group(placement.backend, config.master_addr, config.timeout, device)
    replica = build_replica(config, cluster, device, precision, loaders)
    model, method = replica.model, replica.method
    recorder, alignments = recording(config, cluster, device, replica)
    sync_model = job_model(config, cluster, model, method, device)
    # the flags given, else the model's defaults
    settings = config.optimizer_settings
    optimizer = method.make_optimizer(model, lambda params: OPTIMIZERS[settings.optimizer].build(params, settings))

    # optimizer steps, of --accumulate micro-batches each
    steps_per_epoch = len(loaders.train) // config.accumulate
    if not steps_per_epoch:
        raise UserError(no_step_error(config, info.world_size, loaders.sampler))
    total_steps = min(config.epochs * steps_per_epoch, config.max_steps or float("inf"))
    checkpoints = Checkpointer(config, cluster, precision.name)
    resume = load_for_resume(config, cluster, total_steps, model)
    outside = window_outside(config, resume.position.step + 1 if resume else 1, total_steps)
    if outside:
        raise UserError(outside)
    gradients = OptimizerGradients(precision=precision, method=method, optimizer=optimizer,
                                   max_norm=config.clip_grad_norm, device=device, world_size=info.world_size)
    if resume:
        resume_state(resume, replica, optimizer, gradients)
    # the whole run's schedule, so that --max-steps and resuming keep the same curve
    learning_rate = LearningRate(optimizer=optimizer, peak=settings.lr, kind=config.lr_schedule,
                                 warmup_steps=settings.warmup_steps, total_steps=config.epochs * steps_per_epoch,
                                 steps_done=resume.position.step if resume else 0)
    job_info = JobInfo(
        world_size=info.world_size, backend=placement.backend, hosts=tuple(cluster.hosts), threads=placement.threads,
        rendezvous=rendezvous, batch_size_per_rank=config.per_rank(info.world_size), steps_per_epoch=steps_per_epoch,
        total_steps=total_steps, compression=SYNC_METHODS[config.sync].traits.compression_name(config.compression),
        **layout_params(cluster.hosts), resumed_from=resumed_from(resume), advice=advised,
        data_path=loaders.describe(), compile_s=replica.compile_s, precision=precision.name,
        warnings=tuple(filter(None, [slow_on_cpu(precision, device),
                                     short_set(len(train_set), config, info.world_size),
                                     long_warmup(config, steps_per_epoch),
                                     changed_course(resume, config, precision.name),
                                     one_host_level(config, cluster.hosts)])),
        overlap_lost_to_compile=method.traits.lost_when_compiled if config.compile else None,
        untrained_parameters=untrained,
    )
    preemption = Preemption(config.checkpoint_dir is not None, info.world_size,
                            terminate_at_boundary=cluster.environment.resizes_on_restart)
    agreement = StepAgreement(preemption, info.rank, info.world_size, device)
    return Job(
        info=job_info, device=device, model=model, net=replica.net, method=method, optimizer=optimizer,
        learning_rate=learning_rate, sync_model=sync_model, train_loader=loaders.train, sampler=loaders.sampler,
        test_loader=loaders.test, checkpoints=checkpoints, resume=resume, preemption=preemption, agreement=agreement,
        connection=connection, fault=fault, slow=slow, recorder=recorder, alignments=alignments,
        sent_per_sync=bytes_sent_per_sync(method, model, list(cluster.hosts), info.rank),
        memory_before=memory_before, precision=precision, gradients=gradients,
        overflow=overflowing(model, precision.scaled),
    )


def no_step_error(config: TrainConfig, world_size: int, sampler: ResumableSampler) -> str:
    """Why a pass over the training set holds no optimizer step, and what gives it one (text always has one)."""
    per_rank, samples = config.per_rank(world_size), sampler.num_samples
    left_out = " (a last batch of one is left out)" if sampler.left_out else ""
    micro = config.micro_batch(world_size)
    split = f", in {config.accumulate} micro-batches of {micro:,}" if config.accumulate > 1 else ""
    return (f"{config.dataset}'s training set gives each of {world_size} rank(s) {samples:,} sample(s) a pass"
            f"{left_out}, too few for one step of --batch-size {config.batch_size} ({per_rank:,} per rank{split}): "
            f"no step could run. Use a smaller --batch-size or --accumulate, fewer ranks, or more data.")


def resized_by_launcher(config: TrainConfig, environment: ClusterEnvironment) -> TrainConfig:
    """Under a launcher that restarts the job at another world size by itself (torchrun's agent, --nnodes MIN:MAX),
    --resume auto continues a checkpoint of any world size, as --reshard does under mpirun: no flag is added on such
    a restart. A global batch these ranks do not split is refused in the launcher's terms."""
    if config.resume != RESUME_AUTO or not environment.resizes_on_restart:
        return config
    refused = environment.resized_split_error(config.batch_size, config.accumulate)
    if refused:
        raise UserError(refused)
    return replace(config, reshard=True)


def short_set(samples: int, config: TrainConfig, world_size: int) -> str | None:
    """A sentence for a training set smaller than one global batch, else None: each step then trains on every
    sample, not the batch asked for."""
    if samples >= config.batch_size or config.language_model:  # a text's samples are windows drawn anywhere in it
        return None
    return (f"the training set holds {samples:,} sample(s), fewer than one global batch of {config.batch_size}: "
            f"every step trains on all of them ({math.ceil(samples / world_size):,} per rank), and samples/s and "
            f"FLOP/s count those. Give a --batch-size of at most {samples:,}, or more data.")


def long_warmup(config: TrainConfig, steps_per_epoch: int) -> str | None:
    """A sentence for a --warmup-steps given that lasts the whole schedule, else None: the schedule never begins.
    (A model's default warm-up is left alone: a short demonstration run is mostly warm-up, and says nothing of it.)"""
    schedule = config.epochs * steps_per_epoch
    if config.warmup_steps is None or config.warmup_steps < schedule:
        return None
    return (f"--warmup-steps {config.warmup_steps:,} lasts the whole schedule of {schedule:,} step(s) ({config.epochs} "
            f"epoch(s) of {steps_per_epoch:,}): the rate climbs to --lr {config.optimizer_settings.lr:g} until step "
            f"{config.warmup_steps:,} (the schedule's last: {schedule:,}), and --lr-schedule {config.lr_schedule} "
            f"never begins. Give fewer warm-up steps, or more --epochs.")


def one_host_level(config: TrainConfig, hosts) -> str | None:
    """A sentence for a --host-period given to a job on one host, else None: the average inside each host is then
    the average of all, taken every --period steps already, so the flag changes nothing."""
    if not config.host_period or len(set(hosts)) > 1:
        return None
    return (f"--host-period {config.host_period} averages inside each host between the averages over all hosts, and "
            f"this job's {len(hosts)} rank(s) share one host: it changes nothing here (a two-level average needs "
            f"ranks on several hosts). Drop it, or launch on several hosts.")


def changed_course(resume: Resume | None, config: TrainConfig, precision: str) -> str | None:
    """A sentence for a resumed job that runs another precision, seed or sync method than the checkpoint's job did,
    else None. Each is allowed (a checkpoint written on a GPU goes on on a CPU; a method's state starts afresh), but
    the losses from there are no longer the ones the checkpoint's job would have reached, and a job relaunched by
    hand without the --seed it first had would otherwise draw the rest of its epoch from another order unseen."""
    ran = resume.written_with if resume else None
    if not ran:
        return None
    changes, fixes = [], []
    if ran["precision"] and ran["precision"] != precision:
        changes.append(f"--precision {precision} (it ran {ran['precision']})")
        fixes.append(f"--precision {ran['precision']}")
    if ran["seed"] is not None and ran["seed"] != config.seed:
        drawn = ("the windows drawn from here are another seed's" if config.language_model else
                 "the epochs from here are drawn in another order" if not resume.position.step_in_epoch else
                 "the rest of this epoch is drawn in another order, which may train some of its samples twice and "
                 "skip others")
        changes.append(f"--seed {config.seed} (it ran {ran['seed']}: {drawn})")
        fixes.append(f"--seed {ran['seed']}")
    method, held = label(config.sync, config.compression), resume.method
    if held != method:
        changes.append(f"--sync {method} (it ran {held})")
        fixes.append(f"--sync {ran['sync']}" + (f" --compression {ran['compression']}" if held != ran["sync"] else ""))
    if not changes:
        return None
    return (f"this job goes on from step {resume.position.step} of {resume.path} with " + ", ".join(changes)
            + ": allowed, but its losses from here are not those the checkpoint's job would have reached. Relaunch "
              "with " + " ".join(fixes) + " to continue that job exactly.")


def window_outside(config: TrainConfig, first: int, last: int) -> str | None:
    """Why --timeline-steps records nothing of the steps `first` to `last` this job runs, else None (a window that
    runs past them is cut to them, and says so where it is written)."""
    window = config.timeline_window
    if window is None or (window[0] <= last and window[1] >= first):
        return None
    return (f"--timeline-steps {config.timeline_steps} lies outside the steps this job runs, {first:,} to {last:,}: "
            f"the timeline would record none. Give a window within them, e.g. --timeline-steps "
            f"{max(first, last - 9)}:{last}, or leave --timeline-steps out to record them all.")


def samples_per_step(config: TrainConfig, sampler: ResumableSampler | None, world_size: int) -> int:
    """The samples a step trains on over every rank, which samples/s and FLOP/s count: the global batch, or the
    whole of a training set smaller than it (short_set), padded to split evenly."""
    if config.language_model or sampler is None:  # a text's windows fill every batch
        return config.batch_size
    return min(config.batch_size, len(sampler) * world_size)


def placed(config: TrainConfig, cluster: Cluster) -> tuple[Placement, Precision]:
    """This rank's threads, backend and device, and the precision every rank runs at (auto resolved); a backend the
    sync method cannot use, a device without the precision, or a toolchain --compile lacks, refused alike."""
    placement = place(cluster, config.backend, config.threads, config.deterministic)
    # before any collective: torch's own failure would abort the process
    unsupported = backend_error(config.sync, placement.backend)
    if unsupported:
        raise UserError(unsupported)
    precision = agreed_precision(config.precision, placement.device, cluster)
    # every rank's own toolchain, refused alike before any data is read
    if config.compile:
        cluster.agree(toolchain_error(placement.device, config.compile_mode), "--compile cannot build its kernels")
    return placement, precision


def build_replica(config: TrainConfig, cluster: Cluster, device: torch.device, precision: Precision,
                  loaders: Loaders) -> Replica:
    """The model from one seed on every rank, checked identical, its kernels tuned or compiled, wrapped by its sync
    method; each rank's own random streams from here on (dropout, the DataLoader path's augmentation)."""
    seed_everything(config.seed)
    model = config.make_model().to(device)
    if config.sync_bn:
        globalise_batchnorm(model)
    check_replicas_agree(cluster, model, "at start", BUILT_APART)
    tokens = torch.int64 if config.language_model else None
    # Under the job's autocast: a bfloat16 convolution is another kernel to tune than a float32 one (an H200's
    # CIFAR-10 epoch in bf16-mixed paid 2.7 s of tuning mid-epoch when the warm-up ran in float32). A compiled job's
    # warm-up meets every shape instead, in the layout its graphs run.
    if not config.compile:
        warm_autotuner(model, config.input_shape, *loaders.batch_sizes, device, tokens,
                       computing=lambda: precision.autocast(device))
    seed_rank_streams(config.seed, cluster.info.rank)
    # auto resolved: fsdp gathers its parameters in the precision every rank agreed on
    method = build_method(config.sync, replace(config, precision=precision.name))
    # before a wrapper lays out its buckets or shards
    if config.compile and wants_channels_last(model, device, method):
        model.to(memory_format=torch.channels_last)
    net = method.wrap(model)
    if not config.compile:
        return Replica(model=model, method=method, net=net, compile_s=None)
    # every rank runs the same shapes, so that a wrapper's collectives in the warm-up pair up
    windows = partial(zero_windows, context=config.input_shape[0], device=device) if config.language_model else None
    shapes = partial(run_shapes, net, model, config.input_shape, *shared_sizes(cluster, loaders.batch_sizes),
                     device, tokens, scoring=method.evaluated(model), make_input=windows,
                     computing=partial(precision.autocast, device))
    compiled_s = compile_net(net, model, method, config.compile_mode, device, shapes)
    return Replica(model=model, method=method, net=net, compile_s=max(cluster.allgather(compiled_s)))


def recording(config: TrainConfig, cluster: Cluster, device: torch.device,
              replica: Replica) -> tuple[StepRecorder, list[Alignment]]:
    """The recorder of every step's phases and messages, on a clock aligned to rank 0's; every rank's alignment."""
    if cluster.info.world_size > 1:
        alignment, alignments = align_clocks(cluster, device)
    else:
        alignment, alignments = Alignment(), [Alignment()]
    recorder = StepRecorder(alignment, replica.method.traits.overlapped(), config.timeline_window,
                            gpu=device.type == "cuda")
    recorder.watch(replica.model)
    replica.method.record_into(recorder)
    return recorder, alignments


def resume_state(resume: Resume, replica: Replica, optimizer: torch.optim.Optimizer,
                 gradients: OptimizerGradients) -> None:
    """The checkpoint's weights, optimizer state (a sharding method keeps its shard), the method's step count and
    16-mixed's loss scale, the same on every rank; each rank's random state comes right before its first batch."""
    replica.method.load(replica.model, optimizer, {"model": resume.model_state, "optimizer": resume.optimizer_state},
                        resume.position.step)
    gradients.load_state_dict(resume.loss_scaler)


def resumed_from(resume: Resume | None) -> dict | None:
    """The checkpoint a resumed job continues, as its JobInfo reports it."""
    if resume is None:
        return None
    return {"checkpoint": str(resume.path), "step": resume.position.step, "run_id": resume.parent_run_id,
            "world_size": resume.world_size}
