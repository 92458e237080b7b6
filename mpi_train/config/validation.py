"""The checks a job's TrainConfig passes before any work starts; each refusal says what is wrong and how to fix it.

TrainConfig.validate runs them, so they take the config as an argument and this module does
not import train_config.py back.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..errors import UserError
from ..memory import host_memory
from ..memory import size as memory_size
from ..models.gpt import GPT_SIZES
from ..netmodel.links import rate_bytes_per_s
from ..step.compiling import flags_error as compile_flags_error
from ..step.gradients import scaled_compression_error
from ..sync import (
    METHOD_OPTIONS,
    PARAMETERS,
    SYNC_METHODS,
    combination_error,
    compressions_tuned_by,
    method_option_names,
    reads_option,
    tuned_by,
)
from .fields import RESUME_AUTO

UNBOUNDED = ("clip_grad_norm", "bucket_mb")  # float flags to which infinity means something (check_numbers)
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 1e9  # --timeout's range (check_ranges)
MAX_EXPERIMENT_NAME = 500  # MLflow's own limit on an experiment's name
FLOAT32_BYTES = 4  # the weights' dtype whatever --precision (autocast computes in lower precision over them)


def validate(config, world_size: int) -> None:
    """Reject values no run can use, before any work starts."""
    check_ranges(config)
    config.validate_optimizer()
    if config.loader_workers is not None and config.loader_workers < 0:
        raise UserError(f"--loader-workers must not be negative, got {config.loader_workers}; 0 loads in the "
                        f"rank's own process.")
    if config.system_metrics_every < 0:
        raise UserError(f"--system-metrics-every must not be negative, got {config.system_metrics_every}; 0 turns "
                        f"system metrics off.")
    validate_method_options(config)
    if not config.no_tracking and not 0 < len(config.experiment.strip()) <= MAX_EXPERIMENT_NAME:
        got = f"{len(config.experiment):,} characters" if config.experiment.strip() else "an empty name"
        raise UserError(f"--experiment must name an MLflow experiment in 1 to {MAX_EXPERIMENT_NAME} characters "
                        f"(MLflow takes no other), and got {got}. Name one of that length, or leave the flag out for "
                        f"mpi_train.")
    refused = (combination_error(config.sync, config.compression) or compile_flags_error(config)
               or scaled_compression_error(config.precision, config.sync, config.compression))
    if refused:
        raise UserError(refused)
    check_flag_pairs(config)
    check_data(config)
    check_batch_split(config, world_size)


def check_numbers(config) -> None:
    """A float flag holds a number (nan none), and a finite one, but where infinity means something: no clipping
    that still logs the norm (--clip-grad-norm inf), one bucket for every gradient (--bucket-mb inf)."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value) and field.name not in UNBOUNDED):
            kind = "a number" if field.name in UNBOUNDED else "a finite number"
            raise UserError(f"--{field.name.replace('_', '-')} must be {kind}, got {value}.")
    if not 0 <= config.seed < 2**32:
        raise UserError(f"--seed must be in [0, 2**32), the seeds numpy and torch take alike, got {config.seed}.")


def check_timeout(seconds: float) -> None:
    """--timeout within MIN_TIMEOUT_S..MAX_TIMEOUT_S (NaN is not), for every command whose ranks wait on each other."""
    if not MIN_TIMEOUT_S <= seconds <= MAX_TIMEOUT_S:
        raise UserError(f"--timeout {seconds:g} is out of range: give from {MIN_TIMEOUT_S:g} s (a collective waits "
                        f"that long for the slowest rank, and a shorter wait would end healthy jobs as if a rank had "
                        f"failed) to {MAX_TIMEOUT_S:,.0f} s (about {MAX_TIMEOUT_S / 86400 / 365:.0f} years: waiting "
                        f"for ever).")


def check_ranges(config) -> None:
    """Numbers that must be positive, or not negative; the methods' options check their own."""
    check_numbers(config)
    positive = {
        "--batch-size": config.batch_size, "--epochs": config.epochs, "--log-every": config.log_every,
        "--timeout": config.timeout, "--lr": config.optimizer_settings.lr, "--accumulate": config.accumulate,
    }
    optional = {"--synthetic-size": config.synthetic_size, "--eval-every": config.eval_every,
                "--max-steps": config.max_steps, "--threads": config.threads,
                "--checkpoint-every": config.checkpoint_every, "--clip-grad-norm": config.clip_grad_norm}
    for flag, value in optional.items():
        if value is not None:
            positive[flag] = value
    for flag, value in positive.items():
        if value <= 0:
            raise UserError(f"{flag} must be positive, got {value}. Pass a value greater than zero.")
    check_timeout(config.timeout)
    optimizer = config.optimizer_settings
    for flag, value in {"--momentum": optimizer.momentum, "--weight-decay": optimizer.weight_decay,
                        "--check-every": config.check_every, "--warmup-steps": optimizer.warmup_steps,
                        "--timing-warmup-steps": config.timing_warmup_steps}.items():
        if value is not None and value < 0:
            raise UserError(f"{flag} must not be negative, got {value}.")
    if optimizer.momentum is not None and optimizer.momentum >= 1:
        raise UserError(f"--momentum must be in [0, 1), got {optimizer.momentum}: at 1 or above the momentum buffer "
                        f"never forgets a gradient and the steps grow without bound. 0.9 is the usual value.")


def validate_method_options(config) -> None:
    """The methods' and compressors' own flags: only with a job that reads them, then in range."""
    for name in method_option_names():
        given = config.overlap if name == "overlap" else getattr(config, name) is not None
        if given and not reads_option(config.sync, config.compression, name):
            raise UserError(unread_option_error(config, name))
    for _, check in METHOD_OPTIONS:
        if check is not None:
            check(config)


def unread_option_error(config, name: str) -> str:
    """Why a method's or a compressor's flag given to a job that would ignore it is refused, and what to do."""
    flag, methods, compressions = "--" + name.replace("_", "-"), tuned_by(name), compressions_tuned_by(name)
    if methods:
        return (f"{flag} is read by --sync {' and '.join(methods)} only, and this job runs --sync {config.sync}, "
                f"which would ignore it. Drop {flag}, or use --sync {methods[0]}.")
    fixed = [sync for sync, method in SYNC_METHODS.items() if method.traits.fixed_compression in compressions]
    also = f" (and --sync {' and '.join(fixed)})" if fixed else ""
    runs = f"--sync {config.sync}" + (f" --compression {config.compression}" if config.compression != "none" else "")
    return (f"{flag} is read by --compression {' and '.join(compressions)}{also} only, and this job runs {runs}, "
            f"which would ignore it. Drop {flag}, or add --compression {compressions[0]}.")


def check_flag_pairs(config) -> None:
    """Flags that need another, or exclude one; and the texts a flag parses (--link, --timeline-steps)."""
    if config.save_model and config.no_tracking:
        raise UserError("--save-model stores the weights in the job's MLflow run, which --no-tracking turns off. "
                        "Drop one of the two flags.")
    if config.sync_bn and SYNC_METHODS[config.sync].traits.averages == PARAMETERS:
        raise UserError(f"--sync-bn adds up the ranks' BatchNorm statistics at every step, and --sync {config.sync} "
                        f"lets each rank train on its own between model averages: together each rank's steps would "
                        f"depend on the others' at every step all the same. Drop --sync-bn, or use a method that "
                        f"averages gradients (e.g. --sync ddp).")
    if config.resume == RESUME_AUTO and not config.checkpoint_dir:
        raise UserError("--resume auto continues from the latest checkpoint under --checkpoint-dir, which is not "
                        "set. Add --checkpoint-dir (and --checkpoint-every) so the job has checkpoints to "
                        "continue from.")
    if config.reshard and not config.resume:
        raise UserError("--reshard continues a checkpoint on another number of ranks, and there is no --resume to "
                        "continue. Add --resume PATH (or --resume auto with --checkpoint-dir), or drop --reshard.")
    if config.checkpoint_every is not None and not config.checkpoint_dir:
        raise UserError(f"--checkpoint-every {config.checkpoint_every} needs --checkpoint-dir to say where "
                        f"checkpoints go.")
    if config.link is not None:
        try:
            rate_bytes_per_s(config.link)
        except ValueError as error:
            raise UserError(f"--link: {error}.") from None
    try:
        config.timeline_window  # noqa: B018 - parses --timeline-steps
    except ValueError as error:
        raise UserError(f"{error}.") from None
    if config.timeline_dir is not None and not config.timeline_window:
        raise UserError(f"--timeline-dir {config.timeline_dir} says where the timeline is written, and this job "
                        f"records none. Add --timeline (or --timeline-steps FIRST:LAST), or drop --timeline-dir.")


def check_data(config) -> None:
    """The model takes the data set's samples, along the data path chosen."""
    shape = config.validate_model()
    if config.synthetic_size is not None and config.dataset != "synthetic":
        raise UserError(f"--synthetic-size is how many samples --dataset synthetic makes, and this job reads --dataset "
                        f"{config.dataset}, which would ignore it. Drop --synthetic-size; to train on part of a data "
                        f"set, stop early with --max-steps.")
    if len(shape) == 1 and config.loader == "dataloader":
        raise UserError(f"--loader dataloader reads images one by one, and --model {config.model_name} trains on "
                        f"text, which is always held resident (a uint8 tensor of its bytes). Drop --loader.")
    if config.loader_workers is not None and (len(shape) == 1 or config.loader == "resident"):
        held = "text, always held" if len(shape) == 1 else "--loader resident: the data set held"
        raise UserError(f"--loader-workers sets the processes torch's DataLoader reads images with, and this job reads "
                        f"{held} on each rank's device, through no DataLoader, so it would ignore them. Drop "
                        f"--loader-workers, or read images with --loader dataloader.")
    if config.sync_bn:
        # here, not at the top: its torch.compiler.disable imports torch's compiler, a second of every command's start
        from ..models.sync_batchnorm import has_batchnorm

        with torch.device("meta"):  # no memory, no compute
            model = config.make_model()
        if not has_batchnorm(model):
            raise UserError(f"--sync-bn makes BatchNorm layers normalise over the global batch, and --model "
                            f"{config.model_name} has none. Drop --sync-bn.")
    if config.dropout is not None and not 0 <= config.dropout < 1:
        raise UserError(f"--dropout must be in [0, 1), got {config.dropout}.")


def check_batch_split(config, world_size: int) -> None:
    """The global batch splits evenly across the ranks, and each rank's share into --accumulate micro-batches."""
    batch_size, accumulate = config.batch_size, config.accumulate
    if config.reshard and batch_size % (world_size * accumulate):
        raise UserError(reshard_split_error(config, world_size))
    if batch_size % world_size:
        lower = max(world_size, batch_size - batch_size % world_size)
        raise UserError(
            f"--batch-size {batch_size} is the global batch and must split evenly across "
            f"the {world_size} ranks of this job. Use a multiple of {world_size} "
            f"(e.g. {lower} or {lower + world_size}), or change the number of ranks."
        )
    if batch_size % (world_size * accumulate):
        share = world_size * accumulate
        raise UserError(
            f"--accumulate {accumulate} splits each rank's {batch_size // world_size} samples of a step "
            f"(--batch-size {batch_size} over {world_size} ranks) into {accumulate} equal micro-batches, "
            f"which they do not make. Use a --batch-size that is a multiple of {share} (ranks x K), e.g. "
            f"{max(share, batch_size - batch_size % share)}, or another --accumulate."
        )


def reshard_split_error(config, world_size: int) -> str:
    """Why the global batch does not split across this job's ranks under --reshard, and fixes that work: the
    checkpoint continues only with the global batch it was written with, so a multiple of the ranks is a fix
    only for a job started afresh."""
    batch_size, accumulate = config.batch_size, config.accumulate
    share = world_size * accumulate
    lower = max(share, batch_size - batch_size % share)
    ranks = ranks_advice(batch_size, world_size, accumulate)
    into = f" in {accumulate} micro-batches each (--accumulate)" if accumulate > 1 else ""
    fixes = [f"relaunch on {ranks}, which split it"] if ranks else []
    if accumulate > 1 and not batch_size % world_size:
        fixes.append(f"keep the ranks with an --accumulate that divides each rank's "
                     f"{batch_size // world_size} samples")
    elsewhere = " in another --checkpoint-dir" if config.checkpoint_dir else ""
    fixes.append(f"start afresh: drop --resume and --reshard and use a --batch-size that is a multiple of {share} "
                 f"(e.g. {lower} or {lower + share}){elsewhere}")
    advice = "; or ".join(fixes)
    return (f"--reshard continues a checkpoint with the global batch it was written with, and --batch-size "
            f"{batch_size} does not split evenly across the {world_size} ranks of this job{into}. "
            f"{advice[0].upper()}{advice[1:]}.")


def ranks_that_split(batch_size: int, world_size: int, accumulate: int = 1) -> list[int]:
    """The rank counts nearest `world_size`, the next fewer and the next more, across which `batch_size` splits into
    equal shares of `accumulate` equal micro-batches: where a job that keeps its global batch (--reshard) can run."""
    fits = [ranks for ranks in range(1, batch_size // accumulate + 1) if not batch_size % (ranks * accumulate)]
    return [ranks for ranks in fits if ranks < world_size][-1:] + [ranks for ranks in fits if ranks > world_size][:1]


def ranks_advice(batch_size: int, world_size: int, accumulate: int = 1) -> str | None:
    """Where a global batch that must stay (--reshard) and does not split across `world_size` ranks does split, as
    "2 or 4 ranks (mpirun -np 2 or -np 4)"; None where it splits already, or across no rank count."""
    counts = ranks_that_split(batch_size, world_size, accumulate)
    if not batch_size % (world_size * accumulate) or not counts:
        return None
    return f"{' or '.join(map(str, counts))} ranks (mpirun -np {' or -np '.join(map(str, counts))})"


def refuse_weights_beyond_host(shape) -> None:
    """A UserError where a GPT's float32 weights alone would not fit this host's memory: building it would take
    minutes in silence before the host ran out. Every command builds the model whole on the host first."""
    host, weights = host_memory(), shape.parameters * FLOAT32_BYTES
    if host is not None and weights > host[1]:
        raise UserError(f"--model gpt of {shape.describe()} has {shape.parameters:,} parameters, and their float32 "
                        f"weights alone take {memory_size(weights)}, more than this host's {memory_size(host[1])} of "
                        f"memory (training keeps gradients and optimizer state besides). Lower --gpt-layers or "
                        f"--gpt-width: --gpt-size medium has {GPT_SIZES['medium'].parameters:,}.")
