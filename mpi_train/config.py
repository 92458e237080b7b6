"""The one training configuration: a frozen dataclass whose field docs are the CLI help.

Precedence is written down once: CLI > file > environment > defaults. A flag given on the
command line overrides the job file's key (`--config FILE.toml`, read by `parse_job_file`),
which overrides the environment (`MLFLOW_TRACKING_URI` fills --tracking-uri, `MASTER_ADDR`
--master-addr, when neither names them), which overrides the defaults below.
`commands/train.py` builds the argument parser from these fields, so
a new option is one new field here; a field whose `choices` names a registry below
offers that registry's keys (and the words its `also` adds, like --sync auto).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

from .environments import LAUNCHERS  # the --launcher names, one per cluster environment
from .errors import UserError
from .lr_schedule import LR_SCHEDULES, OptimizerDefaults, optimizer_defaults
from .models import GPT_SIZES, TOKENS, GptShape, build_model, resolve
from .models import HELP as MODEL_HELP
from .models import check as check_model
from .models.user import is_path as is_users
from .netmodel.links import rate_bytes_per_s
from .optimizers import OPTIMIZERS
from .step.compiling import COMPILE_MODES
from .step.compiling import flags_error as compile_flags_error
from .step.gradients import scaled_compression_error
from .step.precision import PRECISION_AUTO, PRECISIONS
from .sync import COMPRESSORS, SYNC_METHODS, combination_error, label, tuned_by
from .sync.averaging import DEFAULT_PERIOD, MOMENTUM, STREAMED_COMPRESSIONS
from .sync.diloco import DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM
from .timeline import ALL_STEPS, parse_window

ENV_DEFAULTS = {"tracking_uri": "MLFLOW_TRACKING_URI"}  # field filled from the environment when its flag is absent
DATASET_DEFAULT_MODEL = {"cifar10": "vgg11", "mnist": "mnist_cnn", "text": "gpt", "synthetic": "mnist_cnn",
                         "imagefolder": "resnet18"}
USERS_DATASET_MODEL = "resnet18"  # the default model on a data set of the user's own (--dataset MODULE:FUNCTION)
# (channels, height, width) of each image data set; synthetic makes what the model takes, text is bytes
DATASET_SHAPES = {"cifar10": (3, 32, 32), "mnist": (1, 28, 28)}
BACKENDS = ("auto", "gloo", "nccl")
LOADERS = ("auto", "resident", "dataloader")  # the data paths (data/loaders.py)
RESUME_AUTO = "auto"  # --resume auto: the latest checkpoint under --checkpoint-dir, if any
SYNC_AUTO = "auto"  # --sync auto: the method an advice recommends (advice/cache.py), resolved before setup
ADVICE_DIR = "mlruns/advice"  # where python -m mpi_train advise keeps its advice and --sync auto looks for it
# a field's `choices` names one (--model: models/)
REGISTRIES = {"sync": SYNC_METHODS, "compression": COMPRESSORS, "optimizer": OPTIMIZERS}


class DatasetNames(tuple):
    """--dataset's choices: the data sets named here, and any MODULE:FUNCTION, a data set of the user's own."""

    def __contains__(self, name) -> bool:
        return super().__contains__(name) or (isinstance(name, str) and is_users(name))


def _opt(default, help, **extra):
    """A field with its CLI help attached (`choices`, `also`: choices beyond a registry's, `metavar` may be added)."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class TrainConfig:
    # What to train.
    sync: str = _opt("allreduce", "gradient synchronisation method; auto: the one python -m mpi_train advise "
                     "recommends for this job's hosts, model, batch and world size (see --advice)", choices="sync",
                     also=(SYNC_AUTO,))
    advice: str | None = _opt(None, f"with --sync auto: the advice to follow, a JSON of python -m mpi_train advise or "
                              f"a folder of them (default: the newest for this job's setting under {ADVICE_DIR}/)",
                              metavar="PATH")
    bucket_mb: float = _opt(25.0, "bucket size in megabytes for --sync bucketed and zero: smaller buckets start "
                            "communicating earlier in backward, larger ones make fewer calls")
    compression: str = _opt("none", "what the sync method's messages carry: none (float32), fp16 or bf16 (half the "
                            "bytes), powersgd (rank-r factors of each gradient matrix); taken by allreduce, flat, "
                            "bucketed, ring, hierarchical, localsgd and diloco, and by zero (fp16, bf16)",
                            choices="compression")
    powersgd_rank: int = _opt(2, "rank r of PowerSGD's factors (--compression powersgd, ddp_powersgd): an n x m "
                              "gradient travels as (n + m)·r numbers")
    powersgd_start_step: int = _opt(100, "steps of plain (uncompressed) averaging before PowerSGD starts "
                                    "(ddp_powersgd: at least 2, torch's minimum)")
    # Syncing less often (localsgd, diloco): flags left unset take these methods' defaults.
    period: int | None = _opt(None, f"localsgd, diloco: optimizer steps between two averages of the ranks' models "
                              f"(default {DEFAULT_PERIOD})", metavar="H")
    local_start_step: int | None = _opt(None, "localsgd, diloco: steps of plain gradient averaging before the ranks "
                                        "step alone (post-local SGD; default 0)")
    host_period: int | None = _opt(None, "localsgd, diloco across hosts: also average the models of each host's ranks "
                                   "every this many steps, over their local link (two levels; default 0: off)")
    local_momentum: str | None = _opt(None, "localsgd, diloco: what an average does to each rank's optimizer "
                                      "state (SGD's momentum, AdamW's moments): keep it (default), average it too (as "
                                      "many bytes again) or reset it",
                                      choices=MOMENTUM)
    overlap: bool = _opt(False, "localsgd, diloco: send each average in the background while the next period computes, "
                         "and merge it one period late as a correction (the rank keeps its own progress since); the "
                         "job waits only for a sum not yet arrived at its merge, and at its end "
                         "(docs/sync-methods.md)")
    fragments: int | None = _opt(None, "localsgd, diloco: cut the model into F element-strided fragments and average "
                                 "one every --period/F steps, an even load on the link instead of a burst (default 1; "
                                 "F must divide --period)", metavar="F")
    outer_lr: float | None = _opt(None, f"diloco: learning rate of the outer Nesterov step (default "
                                  f"{DEFAULT_OUTER_LR})")
    outer_momentum: float | None = _opt(None, f"diloco: momentum of the outer Nesterov step (default "
                                        f"{DEFAULT_OUTER_MOMENTUM})")
    dataset: str = _opt("cifar10", "data set: cifar10, mnist, text (the bytes of any UTF-8 text file or folder of "
                        "them at --data-dir, for --model gpt), synthetic (images, or tokens for gpt), imagefolder "
                        "(--data-dir's train/<class>/* and val/<class>/* or test/<class>/*: any classes, sizes and "
                        "image modes, resized to --image-size) or your own as MODULE:FUNCTION (a function "
                        "load(data_dir) returning (train, test, num_classes); docs/training.md)",
                        choices=DatasetNames(DATASET_DEFAULT_MODEL), metavar="NAME|MODULE:FUNCTION")
    image_size: int | None = _opt(None, "--dataset imagefolder only: the side of the square images the model trains "
                                  "on; each image is kept resized to 8/7 of it (the decoded cache's size), randomly "
                                  "cropped to it to train, centre-cropped to evaluate (default: 64)", metavar="PIXELS")
    model: str | None = _opt(None, MODEL_HELP, metavar="NAME|MODULE:CALLABLE")
    data_dir: str = _opt("data", "where data sets are read from (and downloaded to); --dataset text: a text file or a "
                         "folder of them")
    synthetic_size: int = _opt(4096, "training samples of --dataset synthetic (its test set is a quarter of that); "
                               "for gpt, sequences of the context's length")
    gpt_size: str = _opt("tiny", "--model gpt's size: " + "; ".join(f"{name}: {shape.describe()}" for name, shape in
                                                                      GPT_SIZES.items()), choices=tuple(GPT_SIZES))
    gpt_layers: int | None = _opt(None, "--model gpt: transformer blocks (default: --gpt-size's)", metavar="N")
    gpt_heads: int | None = _opt(None, "--model gpt: attention heads, which split the width evenly (default: "
                                 "--gpt-size's)", metavar="N")
    gpt_width: int | None = _opt(None, "--model gpt: embedding width (default: --gpt-size's)", metavar="N")
    context: int | None = _opt(None, "--model gpt: tokens (bytes) per sequence, the length of each training window "
                               "(default: --gpt-size's)", metavar="N")
    dropout: float | None = _opt(None, "dropout probability for models that have dropout (default: the model's own)")
    loader: str = _opt("auto", "data path: resident holds the decoded data set on the rank's device (GPU memory under "
                        "NCCL, RAM shared by a host's ranks on CPUs: CIFAR-10 176 MiB, MNIST 52 MiB per rank) and "
                        "crops, flips and normalises whole batches there; dataloader reads sample by sample through "
                        "torch's DataLoader (for data that does not fit); auto: resident when it fits in half the "
                        "device's free memory", choices=LOADERS)
    loader_workers: int | None = _opt(None, "--loader dataloader: worker processes per rank (default: 0 on CPUs, "
                                      "whose cores the ranks use already; up to 8 on CUDA, with pinned memory)",
                                      metavar="N")

    # Optimisation.
    batch_size: int = _opt(256, "global batch size, split evenly across ranks")
    accumulate: int = _opt(1, "micro-batches per optimizer step: each rank adds up the gradients of K micro-batches "
                           "of its share of --batch-size (which stays the global batch of a step) and the sync runs "
                           "once, after the last", metavar="K")
    epochs: int = _opt(1, "passes over the training set")
    max_steps: int | None = _opt(None, "stop after this many optimizer steps (default: run all epochs)")
    optimizer: str | None = _opt(None, "sgd (momentum, coupled weight decay) or adamw (betas 0.9, 0.95, decoupled "
                                 "weight decay) (default: the model's, adamw for gpt, sgd for every other)",
                                 choices="optimizer")
    lr: float | None = _opt(None, "peak learning rate (default: the model's for its optimizer: 0.01 for vgg11, 0.1 for "
                            "mnist_cnn, 3e-3 for gpt with adamw and 0.1 with sgd; adamw elsewhere 1e-3)")
    momentum: float | None = _opt(None, "SGD momentum (default: the model's, 0.9; --optimizer sgd only)")
    weight_decay: float | None = _opt(None, "weight decay (default: the model's: 5e-4 for the image models with sgd, 0 "
                                      "for gpt; adamw elsewhere 0.01)")
    seed: int = _opt(42, "seed of the model's initial weights (the same on every rank) and of the data order; "
                     "dropout draws from (seed, rank), augmentation from (seed, rank, epoch)")

    # How each step computes (docs/training.md#precision-and-compile).
    precision: str = _opt(PRECISION_AUTO, "what forward and backward compute in: 32-true (float32), bf16-mixed "
                          "(autocast to bfloat16; weights, gradients, optimizer state and so the sync's messages stay "
                          "float32), 16-mixed (autocast to float16 with a loss scale; a step whose gradients overflow "
                          "is skipped on every rank alike); auto: bf16-mixed on a CUDA device that has bfloat16, "
                          "32-true elsewhere", choices=(*PRECISIONS, PRECISION_AUTO))
    compile: bool = _opt(False, "run the model as a torch.compile graph (ddp: torch's compiled DDP); the compile "
                         "time is reported apart (time/compile_s), never in a step")
    compile_mode: str = _opt("default", "with --compile: torch.compile's mode; reduce-overhead replays each step as "
                             "CUDA graphs, max-autotune also searches kernels", choices=COMPILE_MODES)
    clip_grad_norm: float | None = _opt(None, "clip the gradient the optimizer applies to this norm (its norm before "
                                        "clipping is logged as learning/grad_norm); the same norm under every "
                                        "lossless method; under model averaging each rank clips its own",
                                        metavar="MAX")

    # Learning-rate schedule and timing warm-up (the course's plain SGD: --lr-schedule constant --warmup-steps 0).
    lr_schedule: str = _opt("cosine", "learning rate after warm-up: constant, cosine decay to 0 over the run, or step "
                            "(divided by 10 at 50%% and 75%% of it)", choices=LR_SCHEDULES)
    warmup_steps: int | None = _opt(None, "steps over which the learning rate ramps linearly up to --lr (default: the "
                                    "model's: 20 for vgg11 and any model without its own, 40 for mnist_cnn, 50 for "
                                    "gpt)")
    timing_warmup_steps: int = _opt(1, "first steps of the job left out of the reported mean step times (the whole-run "
                                    "means are reported too)")

    # Distributed runtime.
    launcher: str = _opt("auto", "what started the ranks: mpi (mpirun, mpiexec, srun with PMI), torchrun, slurm (srun "
                         "without MPI); auto detects it from the launcher's variables", choices=LAUNCHERS)
    backend: str = _opt("auto", "process-group backend: auto picks nccl when every rank has a GPU", choices=BACKENDS)
    master_addr: str | None = _opt(None, "address rank 0 listens on for the rendezvous under MPI (default: "
                                   "$MASTER_ADDR, else this host's address); torchrun and srun jobs meet at "
                                   "MASTER_ADDR:MASTER_PORT")
    timeout: float = _opt(300.0, "seconds a collective may wait for the other ranks before the job fails")
    deterministic: bool = _opt(False, "on GPUs: cuDNN's deterministic convolutions in place of autotuned ones "
                               "(cudnn.benchmark, the default): slower, but a rerun or a resumed job then equals the "
                               "first bit for bit there too (CPUs always do)")
    threads: int | None = _opt(None, "CPU threads per rank (default: this host's cores divided by its ranks)")
    # Network model (the predicted_sync_time_s metric beside the measured sync_time_s).
    link: str | None = _opt(None, "rate of the links between hosts as shaped or known (e.g. 1gbit), recorded as param "
                            "link; no effect on training")
    calibration: str | None = _opt(None, "a JSON of python -m mpi_train bench whose fitted links predict this job's "
                                   "sync time (default: a ping-pong of 1 KB .. 1 MB at start)", metavar="PATH")

    check_every: int = _opt(100, "every N steps (and at the end) ranks compare a checksum of their weights; 0: only at "
                            "start and end")

    # Output.
    log_every: int = _opt(20, "print the loss averaged over all ranks every N steps")
    eval_every: int | None = _opt(None, "also score the test set every N steps (with the wall time spent training so "
                                  "far, evaluations left out, and the megabytes rank 0 has sent: time and bytes to "
                                  "accuracy); default: at each epoch's end only", metavar="N")
    summary_json: str | None = _opt(None, "rank 0 writes the config, losses, timings and test results here")
    timeline: bool = _opt(False, "record where every step's time goes on every rank (phases, gradients, messages) as a "
                          "Chrome-trace JSON and a swimlane PNG under --timeline-dir, also logged to MLflow")
    timeline_steps: str | None = _opt(None, "the steps the timeline records, FIRST:LAST (e.g. 10:20), FIRST: or one "
                                      "step; implies --timeline (default: every step)", metavar="FIRST:LAST")
    timeline_dir: str = _opt("timelines", "folder for the timeline's trace and swimlanes, named by the run")

    # Checkpoints (written by global rank 0 only, atomically).
    checkpoint_dir: str | None = _opt(None, "write checkpoints (step-NNNNNNNN.pt) to this folder, at the end and every "
                                      "--checkpoint-every steps; the last 3 are kept")
    checkpoint_every: int | None = _opt(None, "steps between checkpoints (default: only at the end); needs "
                                        "--checkpoint-dir")
    resume: str | None = _opt(None, "continue from this checkpoint file, or from the latest checkpoint in this folder, "
                              "exactly as if never stopped; auto: the latest under --checkpoint-dir, or a fresh "
                              "start when there is none (for a launch line that relaunches itself)",
                              metavar="PATH|auto")
    reshard: bool = _opt(False, "with --resume: continue a checkpoint of a job on another number of ranks (a host gone "
                         "for good). The global batch and the data order are kept, so each step trains on the same "
                         "samples; the ranks' random streams are kept where the rank was there before, and "
                         "compression residuals start afresh")

    # Experiment tracking (MLflow; only rank 0 talks to it).
    tracking_uri: str | None = _opt(None, "MLflow tracking server (http://HOST:PORT) or database URI (default: "
                                    "$MLFLOW_TRACKING_URI, else the SQLite store mlruns/mlflow.db)")
    experiment: str = _opt("mpi_train", "MLflow experiment the job's runs are filed under")
    run_name: str | None = _opt(None, "name of the job's parent run (default: SYNC-npN-seedSEED)")
    no_tracking: bool = _opt(False, "do not record the job in MLflow")
    save_model: bool = _opt(False, "log the trained model to the job's run, as an MLflow model that "
                                  "mlflow.pytorch.load_model(\"runs:/<run id>/model\") loads")
    system_metrics_every: float = _opt(10.0, "seconds between CPU, memory, network and disk samples per host (taken at "
                                       "logged steps); 0 turns them off")
    tracking_spool: bool = _opt(False, "if the tracking server cannot be reached at start, train anyway and keep "
                                "everything in a spool under mlruns/spool/ for `python -m mpi_train replay` (mid-run "
                                "outages are always spooled)")

    @property
    def model_name(self) -> str:
        """The model actually trained: --model, or the data set's default."""
        return self.model or DATASET_DEFAULT_MODEL.get(self.dataset, USERS_DATASET_MODEL)

    @property
    def optimizer_settings(self) -> OptimizerDefaults:
        """The optimizer, its lr, momentum, weight decay and warm-up: each flag given, else the model's default."""
        defaults = optimizer_defaults(self.model_name, self.optimizer)
        given = {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay,
                 "warmup_steps": self.warmup_steps}
        return dataclasses.replace(defaults, **{key: value for key, value in given.items() if value is not None})

    @property
    def gpt_shape(self) -> GptShape:
        """--model gpt's layers, heads, width and context: --gpt-size's, with each flag given in their place."""
        given = {"layers": self.gpt_layers, "heads": self.gpt_heads, "width": self.gpt_width, "context": self.context}
        return dataclasses.replace(GPT_SIZES[self.gpt_size], **{k: v for k, v in given.items() if v is not None})

    @property
    def input_shape(self) -> tuple[int, ...]:
        """What the model takes per sample: (channels, height, width) of images, or (context,) tokens; a UserError
        if it cannot take the data set's."""
        shape, classes = self.data_spec
        return check_model(self.model_name, self.dataset, shape, self.gpt_shape, classes)

    @property
    def data_spec(self) -> tuple[tuple[int, ...] | None, int]:
        """The data set's image shape (None: made in the model's, or text) and class count (data/spec.py)."""
        from .data.spec import data_spec  # here, not at the top: the data package imports this module

        return data_spec(self.dataset, self.data_dir, self.image_size, DATASET_SHAPES, tuple(DATASET_DEFAULT_MODEL))

    @property
    def language_model(self) -> bool:
        """The model takes tokens (gpt), not images."""
        return resolve(self.model_name).takes == TOKENS

    def make_model(self):
        """The model this job trains (on the current default device)."""
        return build_model(self.model_name, self.dropout, self.input_shape, self.gpt_shape, self.data_spec[1])

    @property
    def timeline_window(self) -> tuple[int, int] | None:
        """The steps --timeline records (both ends included), or None without a timeline."""
        if not (self.timeline or self.timeline_steps):
            return None
        return parse_window(self.timeline_steps) or (1, ALL_STEPS)

    def as_dict(self) -> dict:
        """The resolved config, as saved in summaries and run artifacts (passwords in URIs masked)."""
        return {**dataclasses.asdict(self), "model": self.model_name, **dataclasses.asdict(self.optimizer_settings),
                "tracking_uri": redact_uri(self.tracking_uri)}

    def validate(self, world_size: int) -> None:
        """Reject values no run can use, before any work starts."""
        positive = {
            "--batch-size": self.batch_size, "--epochs": self.epochs, "--log-every": self.log_every,
            "--synthetic-size": self.synthetic_size, "--timeout": self.timeout, "--lr": self.optimizer_settings.lr,
            "--bucket-mb": self.bucket_mb, "--powersgd-rank": self.powersgd_rank, "--accumulate": self.accumulate,
        }
        if self.eval_every is not None:
            positive["--eval-every"] = self.eval_every
        if self.max_steps is not None:
            positive["--max-steps"] = self.max_steps
        if self.threads is not None:
            positive["--threads"] = self.threads
        if self.checkpoint_every is not None:
            positive["--checkpoint-every"] = self.checkpoint_every
        if self.clip_grad_norm is not None:
            positive["--clip-grad-norm"] = self.clip_grad_norm
        for flag, value in positive.items():
            if value <= 0:
                raise UserError(f"{flag} must be positive, got {value}. Pass a value greater than zero.")
        optimizer = self.optimizer_settings
        for flag, value in {"--momentum": optimizer.momentum, "--weight-decay": optimizer.weight_decay,
                            "--check-every": self.check_every, "--warmup-steps": optimizer.warmup_steps,
                            "--timing-warmup-steps": self.timing_warmup_steps,
                            "--powersgd-start-step": self.powersgd_start_step}.items():
            if value is not None and value < 0:
                raise UserError(f"{flag} must not be negative, got {value}.")
        self.validate_optimizer()
        if self.loader_workers is not None and self.loader_workers < 0:
            raise UserError(f"--loader-workers must not be negative, got {self.loader_workers}; 0 loads in the "
                            f"rank's own process.")
        if self.system_metrics_every < 0:
            raise UserError(f"--system-metrics-every must not be negative, got {self.system_metrics_every}; 0 turns "
                            f"system metrics off.")
        self.validate_averaging()
        refused = (combination_error(self.sync, self.compression) or compile_flags_error(self)
                   or scaled_compression_error(self.precision, self.sync, self.compression))
        if refused:
            raise UserError(refused)
        if self.save_model and self.no_tracking:
            raise UserError("--save-model stores the weights in the job's MLflow run, which --no-tracking turns off. "
                            "Drop one of the two flags.")
        if self.resume == RESUME_AUTO and not self.checkpoint_dir:
            raise UserError("--resume auto continues from the latest checkpoint under --checkpoint-dir, which is not "
                            "set. Add --checkpoint-dir (and --checkpoint-every) so the job has checkpoints to "
                            "continue from.")
        if self.reshard and not self.resume:
            raise UserError("--reshard continues a checkpoint on another number of ranks, and there is no --resume to "
                            "continue. Add --resume PATH (or --resume auto with --checkpoint-dir), or drop --reshard.")
        if self.checkpoint_every is not None and not self.checkpoint_dir:
            raise UserError(f"--checkpoint-every {self.checkpoint_every} needs --checkpoint-dir to say where "
                            f"checkpoints go.")
        if self.link is not None:
            try:
                rate_bytes_per_s(self.link)
            except ValueError as error:
                raise UserError(f"--link: {error}.") from None
        try:
            self.timeline_window  # noqa: B018 - parses --timeline-steps
        except ValueError as error:
            raise UserError(f"{error}.") from None
        shape = self.validate_model()
        if len(shape) == 1 and self.loader == "dataloader":
            raise UserError(f"--loader dataloader reads images one by one, and --model {self.model_name} trains on "
                            f"text, which is always held resident (a uint8 tensor of its bytes). Drop --loader.")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise UserError(f"--dropout must be in [0, 1), got {self.dropout}.")
        if self.reshard and self.batch_size % (world_size * self.accumulate):
            raise UserError(self.reshard_split_error(world_size))
        if self.batch_size % world_size:
            lower = max(world_size, self.batch_size - self.batch_size % world_size)
            raise UserError(
                f"--batch-size {self.batch_size} is the global batch and must split evenly across "
                f"the {world_size} ranks of this job. Use a multiple of {world_size} "
                f"(e.g. {lower} or {lower + world_size}), or change the number of ranks."
            )
        if self.batch_size % (world_size * self.accumulate):
            share = world_size * self.accumulate
            raise UserError(
                f"--accumulate {self.accumulate} splits each rank's {self.batch_size // world_size} samples of a step "
                f"(--batch-size {self.batch_size} over {world_size} ranks) into {self.accumulate} equal micro-batches, "
                f"which they do not make. Use a --batch-size that is a multiple of {share} (ranks x K), e.g. "
                f"{max(share, self.batch_size - self.batch_size % share)}, or another --accumulate."
            )

    def reshard_split_error(self, world_size: int) -> str:
        """Why the global batch does not split across this job's ranks under --reshard, and fixes that work: the
        checkpoint continues only with the global batch it was written with, so a multiple of the ranks is a fix
        only for a job started afresh."""
        share = world_size * self.accumulate
        lower = max(share, self.batch_size - self.batch_size % share)
        ranks = ranks_advice(self.batch_size, world_size, self.accumulate)
        into = f" in {self.accumulate} micro-batches each (--accumulate)" if self.accumulate > 1 else ""
        fixes = [f"relaunch on {ranks}, which split it"] if ranks else []
        if self.accumulate > 1 and not self.batch_size % world_size:
            fixes.append(f"keep the ranks with an --accumulate that divides each rank's "
                         f"{self.batch_size // world_size} samples")
        elsewhere = " in another --checkpoint-dir" if self.checkpoint_dir else ""
        fixes.append(f"start afresh: drop --resume and --reshard and use a --batch-size that is a multiple of {share} "
                     f"(e.g. {lower} or {lower + share}){elsewhere}")
        advice = "; or ".join(fixes)
        return (f"--reshard continues a checkpoint with the global batch it was written with, and --batch-size "
                f"{self.batch_size} does not split evenly across the {world_size} ranks of this job{into}. "
                f"{advice[0].upper()}{advice[1:]}.")

    def validate_model(self) -> tuple[int, ...]:
        """The model's flags: gpt's sizes in range, and a model that resolves and takes the data set's samples. Returns
        what it takes per sample. Every command that builds the model (train, bench, advise, predict, gpu-check)
        asks this."""
        for flag, value in {"--gpt-layers": self.gpt_layers, "--gpt-heads": self.gpt_heads,
                            "--gpt-width": self.gpt_width, "--context": self.context}.items():
            if value is not None and value <= 0:
                raise UserError(f"{flag} must be positive, got {value}.")
        gpt_shape = self.gpt_shape
        if gpt_shape.width % gpt_shape.heads:
            raise UserError(f"--gpt-width {gpt_shape.width} must split evenly across --gpt-heads {gpt_shape.heads}. "
                            f"Use a width that is a multiple of {gpt_shape.heads}, or other heads.")
        return self.input_shape  # resolves the model (importing a user's) and refuses one the data cannot feed

    def describe_model(self) -> str:
        """The model as a report names it: gpt with its size, any other by its name."""
        if self.language_model and self.model_name == "gpt":
            return f"gpt ({self.gpt_shape.describe()})"
        return self.model_name

    def validate_optimizer(self) -> None:
        """Flags only SGD reads are refused with an optimizer that would ignore them."""
        name = self.optimizer_settings.optimizer
        if OPTIMIZERS[name].reads_momentum:
            return
        if self.momentum is not None:
            raise UserError(f"--momentum {self.momentum} is SGD's and this job steps with {name} (--optimizer "
                            f"{self.optimizer or name + ', the default for ' + self.model_name}), whose betas "
                            f"(0.9, 0.95) take momentum's part and which would ignore it. Drop --momentum, or pass "
                            f"--optimizer sgd.")

    def validate_averaging(self) -> None:
        """The flags of the methods that sync less often: in range, and only with a method that reads them."""
        for name in ("period", "local_start_step", "host_period", "local_momentum", "outer_lr", "outer_momentum",
                     "fragments", *(("overlap",) if self.overlap else ())):
            flag, readers = "--" + name.replace("_", "-"), tuned_by(name)  # the methods whose class reads it
            if getattr(self, name) is not None and self.sync not in readers:
                raise UserError(f"{flag} is read by --sync {' and '.join(readers)} only, and this job runs --sync "
                                f"{self.sync}, which would ignore it. Drop {flag}, or use --sync {readers[0]}.")
        if self.period is not None and self.period < 1:
            raise UserError(f"--period must be at least 1 (average every step), got {self.period}.")
        for flag, value in {"--local-start-step": self.local_start_step, "--host-period": self.host_period}.items():
            if value is not None and value < 0:
                raise UserError(f"{flag} must not be negative, got {value}.")
        period = self.period if self.period is not None else DEFAULT_PERIOD
        if self.host_period and self.host_period >= period:
            raise UserError(f"--host-period {self.host_period} must be shorter than --period {period}: the ranks of a "
                            f"host average among themselves between the averages of all ranks. Use a smaller "
                            f"--host-period, or raise --period.")
        self.validate_streaming(period)
        if self.outer_lr is not None and self.outer_lr <= 0:
            raise UserError(f"--outer-lr must be positive, got {self.outer_lr}.")
        if self.outer_momentum is not None and not 0 <= self.outer_momentum < 1:
            raise UserError(f"--outer-momentum must be in [0, 1), got {self.outer_momentum}.")

    def validate_streaming(self, period: int) -> None:
        """--fragments and --overlap: a fragment count that divides the period, and what their schedule carries."""
        fragments = self.fragments if self.fragments is not None else 1
        if fragments < 1:
            raise UserError(f"--fragments must be at least 1 (1: the whole model at once), got {fragments}.")
        if period % fragments:
            divisors = [d for d in range(1, period + 1) if period % d == 0]
            raise UserError(f"--fragments {fragments} must divide --period {period}: one fragment is averaged every "
                            f"period/F steps, and each once per period. Use one of {', '.join(map(str, divisors))}, "
                            f"or a --period that is a multiple of {fragments}.")
        if not (self.overlap or fragments > 1):
            return
        flags = " ".join(flag for flag, on in (("--overlap", self.overlap), (f"--fragments {fragments}", fragments > 1))
                         if on)
        if self.local_momentum not in (None, "keep"):
            raise UserError(f"--local-momentum {self.local_momentum} with {flags}: averaging or resetting the momentum "
                            f"happens at an average of the whole model, which {flags} no longer has. Drop "
                            f"--local-momentum (each rank keeps its own), or drop {flags}.")
        if self.compression not in STREAMED_COMPRESSIONS:
            raise UserError(f"--compression {self.compression} with {flags}: a fragment (element-strided) or a sum in "
                            f"the background carries elementwise casts only, not {self.compression}'s per-matrix "
                            f"rounds. "
                            f"Use --compression {', '.join(c for c in STREAMED_COMPRESSIONS if c != 'none')} or none "
                            f"with {flags}.")

    def default_run_name(self, world_size: int) -> str:
        return self.run_name or f"{label(self.sync, self.compression)}-np{world_size}-seed{self.seed}"

    def per_rank(self, world_size: int) -> int:
        """Each rank's share of the global batch (validate() guarantees it divides)."""
        return self.batch_size // world_size

    def micro_batch(self, world_size: int) -> int:
        """What each rank's forward and backward take at once: its share over --accumulate."""
        return self.per_rank(world_size) // self.accumulate


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


def add_config_arguments(parser, names: Sequence[str] | None = None, defaults: dict | None = None,
                         helps: dict | None = None) -> None:
    """TrainConfig's fields (all, or those `names`) as flags of `parser`, their help the fields' own; `defaults` and
    `helps` (by field name) replace a field's default and help for this parser."""
    defaults, helps = defaults or {}, helps or {}
    for config_field in dataclasses.fields(TrainConfig):
        if names is not None and config_field.name not in names:
            continue
        meta = {key: value for key, value in config_field.metadata.items() if key not in ("choices", "also")}
        choices = field_choices(config_field.name)
        meta["help"] = helps.get(config_field.name, meta["help"])
        flag = "--" + config_field.name.replace("_", "-")
        kind = field_kinds()[config_field.name]
        if kind is bool:  # on/off switches: present means on
            parser.add_argument(flag, action="store_true", **meta)
            continue
        default = defaults.get(config_field.name, config_field.default)
        if default is not None and "default" not in meta["help"]:
            meta["help"] += f" (default: {default})"
        parser.add_argument(flag, type=kind, default=default, choices=choices, **meta)



@functools.cache
def field_kinds() -> dict[str, type]:
    """What each field holds when set: bool, int, float or str (an `int | None` field holds an int)."""
    return {name: next((a for a in typing.get_args(hint) if a is not type(None)), hint)
            for name, hint in typing.get_type_hints(TrainConfig).items()}


def field_choices(name: str) -> tuple | None:
    """The values field `name` takes, as its flag offers them (a registry's keys and the words its `also` adds);
    None: any value of its type."""
    meta = TrainConfig.__dataclass_fields__[name].metadata
    choices = meta.get("choices")
    return (*REGISTRIES[choices], *meta.get("also", ())) if isinstance(choices, str) else choices


# A job file (--config FILE.toml) sets fields by name, one `key = value` a line (batch_size = 256), as an experiment
# file's [train] table does; option_error checks both, so they say the same. Each tracked run logs the job it ran as
# one (job_file), which reruns it: same seed, same losses. What the logged file leaves out, and why:
JOB_FILE_LEAVES_OUT = {
    "summary_json": "an output of the run's own, which a rerun would overwrite",
    "timeline_dir": "an output of the run's own, which a rerun would overwrite",
    "checkpoint_dir": "the run's checkpoints, which a rerun would resume from or overwrite",
    "checkpoint_every": "goes with checkpoint_dir",
    "resume": "a rerun starts afresh, which a resumed job equals (it continued as if never stopped)",
    "reshard": "goes with resume",
    "advice": "the file holds the flags --sync auto took from the advice, in its place",
    "tracking_uri": "where a rerun is recorded is the rerunner's to say (a URI may carry a password)",
    "master_addr": "the rendezvous address of the hosts this run had",
}
TOML_KINDS = {bool: ((bool,), "true or false"), int: ((int,), "an integer"), float: ((int, float), "a number"),
              str: ((str,), "a string")}


def shown(value) -> str:
    """A value of a file as a message names it: a string ('256')."""
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    return f"{kind.get(type(value), type(value).__name__)} ({value!r})" if not isinstance(value, dict) else "a table"


def option_error(name: str, value) -> str | None:
    """Why a file's `value` cannot set field `name` (not of its type, or not one of its choices), or None."""
    kind = field_kinds()[name]
    types, described = TOML_KINDS[kind]
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, types):
        return f"must be {described}, got {shown(value)}."
    choices = field_choices(name)
    if choices and value not in choices:
        close = difflib.get_close_matches(value, choices, n=1)
        return f"{value!r} is not one of {', '.join(choices)}." + (f" Did you mean {close[0]!r}?" if close else "")
    return None


def option_value(name: str, value):
    """A checked value as field `name` holds it: a whole number given for a float, as a float."""
    return float(value) if field_kinds()[name] is float else value


def read_job_file(path: str) -> str:
    """A job file's text; a UserError says why it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        reason = "it is not UTF-8 text"
    except OSError as error:
        reason = error.strerror or str(error)
    raise UserError(f"cannot read the job file {path} (--config): {reason}. Give the path of a TOML file of training "
                    f"options, e.g. the config.toml a tracked run logged.")


def parse_job_file(text: str, path: str) -> dict:
    """A job file's options by field name, each checked as its flag is; a UserError names the file, the line and the
    key of the first mistake."""
    try:
        options = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line = getattr(error, "lineno", None)  # Python >= 3.14; before, only the message carries it
        found = re.search(r"at line (\d+)", str(error))
        line = line or (int(found.group(1)) if found else None)
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(error))
        raise UserError(f"{path}{f', line {line}' if line else ''}: this is not valid TOML: {message}. Write one "
                        f"option a line, key = value, strings in quotes (see https://toml.io).") from None
    for key, value in options.items():
        line = _key_line(text, key)
        where = f"{path}{f', line {line}' if line else ''}, key {key}"
        if key not in field_kinds():
            close = difflib.get_close_matches(key, list(field_kinds()), n=1)
            raise UserError(f"{where}: unknown key {key!r}.{f' Did you mean {close[0]!r}?' if close else ''} A job "
                            f"file sets the options python -m mpi_train train --help lists, by name with _ for - "
                            f"(batch_size = 256), at its top level, without [tables].")
        problem = option_error(key, value)
        if problem:
            raise UserError(f"{where}: {problem}")
    return {key: option_value(key, value) for key, value in options.items()}


def _key_line(text: str, key: str) -> int | None:
    """The line of `text` that sets top-level `key`, or opens it as a [table]: tomllib gives values, not lines."""
    name = "|".join(re.escape(spelt) for spelt in (key, f'"{key}"', f"'{key}'"))
    sets, opens = re.compile(rf"\s*(?:{name})\s*[=.]"), re.compile(rf"\s*\[\[?\s*(?:{name})\s*[\].]")
    top = True  # keys before the first [table] are the top level's
    for number, line in enumerate(text.splitlines(), start=1):
        if opens.match(line):
            return number
        top = top and not line.lstrip().startswith("[")
        if top and sets.match(line):
            return number
    return None


def toml_value(value) -> str:
    """`value` written as TOML: floats by repr, the shortest text that reads back to the same bits."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")  # a JSON string is a TOML basic one


def job_file(config: TrainConfig, world_size: int) -> str:
    """The job `config` describes as a job file: each option as the job ran it (the model and its optimizer's
    settings resolved, unset ones left out) but JOB_FILE_LEAVES_OUT. Run with --config on as many ranks, it computes
    the same job."""
    options = {key: value for key, value in config.as_dict().items()
               if key in field_kinds() and key not in JOB_FILE_LEAVES_OUT and value is not None}
    return (f"# The options of a job on {world_size} rank(s). Run it again with\n"
            f"#   mpirun -np {world_size} python -m mpi_train --config config.toml\n"
            f"# (a flag after it overrides its key; python -m mpi_train train --help says what each option does).\n"
            + "".join(f"{key} = {toml_value(value)}\n" for key, value in options.items()))

# The flags that name the model, for the commands that build it without training it (bench, advise, predict,
# gpu-check): the same names, help and checks as training's.
MODEL_FLAGS = ("model", "gpt_size", "gpt_layers", "gpt_heads", "gpt_width", "context")
TOOL_DATASETS = ("synthetic", "cifar10", "mnist", "text")


def add_model_arguments(parser, default_model: str = "vgg11", dataset: bool = True) -> None:
    """--model and gpt's size flags as training takes them, and (with `dataset`) --dataset: whose samples' shape the
    model is built for (the tool feeds it synthetic data of that shape)."""
    training_default = " (default: vgg11 for cifar10"  # what training's help says of its default; here it is one model
    add_config_arguments(parser, MODEL_FLAGS, defaults={"model": default_model},
                         helps={"model": MODEL_HELP.split(training_default)[0] + f" (default: {default_model})"})
    if not dataset:
        parser.set_defaults(dataset="synthetic")
        return
    parser.add_argument("--dataset", choices=TOOL_DATASETS, default="synthetic",
                        help="the data set whose samples the model is built for: cifar10 and mnist its images' "
                             "shape, text or synthetic what the model takes (images 3x32x32 or the smallest it "
                             "accepts, tokens of gpt's context); the samples themselves are synthetic "
                             "(default: synthetic)")


def model_config(args, **settings) -> TrainConfig:
    """The TrainConfig of add_model_arguments' flags (and `settings`), its model checked as training checks it: a
    UserError names what is wrong."""
    config = TrainConfig(**model_flags(args), **settings)
    config.validate_model()
    return config


def model_flags(args) -> dict:
    """add_model_arguments' flags as given (a bench JSON keeps them, so predict can tell its model from another)."""
    return {name: getattr(args, name) for name in (*MODEL_FLAGS, "dataset")}


def model_flag_words(args) -> list[str]:
    """The model flags to repeat on a training command line: --model and each gpt flag given."""
    words = ["--model", args.model]
    for name in MODEL_FLAGS[1:]:
        value = getattr(args, name)
        if value is not None and value != getattr(TrainConfig, name):
            words += ["--" + name.replace("_", "-"), str(value)]
    return words


def redact_uri(uri: str | None) -> str | None:
    """`uri` with any password replaced by ***, so it can be printed and logged."""
    if not uri:
        return uri
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
        if parts.password is None:
            return uri
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    except ValueError:  # a malformed URI: keep only its scheme, it is rejected later anyway
        return uri.split("://", 1)[0] + "://***" if "@" in uri else uri
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class JobInfo:
    """What a job turned out to be once set up (ranks, hosts, backend, steps): reported, logged and summarised."""

    world_size: int
    backend: str
    hosts: tuple[str, ...]
    threads: int
    rendezvous: str
    batch_size_per_rank: int
    steps_per_epoch: int
    total_steps: int
    compression: str = "none"  # the compression in effect (fp16 for flat_fp16)
    num_hosts: int = 1
    ranks_per_host: int = 1  # the most ranks on one host
    resumed_from: dict | None = None  # checkpoint, step, run id and world size of the job this one continues
    advice: dict | None = None  # under --sync auto: the advice followed (its file, age, the flags it set and why)
    data_path: str = ""  # the data path that runs and what it holds per rank (data/loaders.py)
    precision: str = "32-true"  # the --precision it runs at, auto resolved on its device (step/precision.py)
    compile_s: float | None = None  # under --compile: the setup's compile, the slowest rank's (step/compiling.py)

    def as_dict(self) -> dict:
        """The summary's job fields, in this order; `resumed_from` only when resumed, `advice` only under --sync
        auto, `compile_s` only under --compile."""
        fields = {**dataclasses.asdict(self), "hosts": list(self.hosts)}
        for optional in ("resumed_from", "advice", "compile_s"):
            if fields[optional] is None:
                del fields[optional]
        return fields
