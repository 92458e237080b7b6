"""The one training configuration: a frozen dataclass whose field docs are the CLI help.

It composes the methods' option classes (SyncChoice first, then each method's options, in the
order --help lists them) and holds every other option itself.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from ..errors import UserError
from ..lr_schedule import LR_SCHEDULES, OptimizerDefaults, optimizer_defaults
from ..models import GPT_SIZES, TOKENS, GptShape, build_model, resolve, untrained_parameters
from ..models import HELP as MODEL_HELP
from ..models import check as check_model
from ..optimizers import OPTIMIZERS
from ..step.compiling import COMPILE_MODES
from ..step.precision import PRECISION_AUTO, PRECISIONS
from ..sync import METHOD_OPTIONS, SYNC_METHODS, label, reads_option
from ..sync.flag_fields import option as _opt
from ..timeline import ALL_STEPS, parse_window
from .fields import (
    BACKENDS,
    DATASET_DEFAULT_MODEL,
    DATASET_SHAPES,
    LAUNCHERS,
    LOADERS,
    SYNTHETIC_SIZE,
    TIMELINE_DIR,
    USERS_DATASET_MODEL,
    DatasetNames,
    SyncChoice,
)
from .validation import refuse_weights_beyond_host, validate


# Dataclasses collect fields along the reversed MRO: SyncChoice's come first, then the methods' options in their
# registry's order, this class's own last: the order --help lists them.
@dataclass(frozen=True)
class TrainConfig(*reversed([options for options, _ in METHOD_OPTIONS]), SyncChoice):
    # What to train.
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
    synthetic_size: int | None = _opt(None, "--dataset synthetic only: the training samples it makes (its test set "
                                      "is a quarter of that); for gpt, sequences of the context's length (default: "
                                      f"{SYNTHETIC_SIZE})", metavar="N")
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
    sync_bn: bool = _opt(False, "BatchNorm over the global batch: each BatchNorm layer adds up every rank's "
                         "statistics in forward (and their gradients in backward), so a step computes what one "
                         "process on the whole global batch would, on any number of ranks (a job that shrinks or "
                         "grows keeps its losses); one small allreduce per layer each way")

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
    timeline_dir: str | None = _opt(None, f"folder for the timeline's trace and swimlanes, named by the run "
                                    f"(default: {TIMELINE_DIR})")

    # Checkpoints (written by global rank 0 only, atomically).
    checkpoint_dir: str | None = _opt(None, "write checkpoints (step-NNNNNNNN.pt) to this folder, at the end and every "
                                      "--checkpoint-every steps; the last 3 are kept. One job at a time: a second "
                                      "job on the folder is refused")
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
    def untrained_parameters(self) -> tuple[str, ...]:
        """The model's trainable parameters that no logit depends on (models.untrained_parameters)."""
        return untrained_parameters(self.model_name, self.input_shape, self.gpt_shape, self.data_spec[1])

    @property
    def data_spec(self) -> tuple[tuple[int, ...] | None, int]:
        """The data set's image shape (None: made in the model's, or text) and class count (data/spec.py)."""
        from ..data.spec import data_spec  # here, not at the top: the data package imports this module

        return data_spec(self.dataset, self.data_dir, self.image_size, DATASET_SHAPES, tuple(DATASET_DEFAULT_MODEL))

    @property
    def synthetic_samples(self) -> int:
        """The training samples --dataset synthetic makes: --synthetic-size, or its default."""
        return SYNTHETIC_SIZE if self.synthetic_size is None else self.synthetic_size

    @property
    def language_model(self) -> bool:
        """The model takes tokens (gpt), not images."""
        return resolve(self.model_name).takes == TOKENS

    def make_model(self):
        """The model this job trains (on the current default device)."""
        return build_model(self.model_name, self.dropout, self.input_shape, self.gpt_shape, self.data_spec[1])

    @property
    def timeline_folder(self) -> str:
        """Where the timeline is written: --timeline-dir, or its default."""
        return TIMELINE_DIR if self.timeline_dir is None else self.timeline_dir

    @property
    def timeline_window(self) -> tuple[int, int] | None:
        """The steps --timeline records (both ends included), or None without a timeline."""
        if not (self.timeline or self.timeline_steps):
            return None
        return parse_window(self.timeline_steps) or (1, ALL_STEPS)

    def as_dict(self) -> dict:
        """The resolved config, as saved in summaries and run artifacts (passwords in URIs masked)."""
        synthetic = self.synthetic_samples if self.dataset == "synthetic" else None
        return {**dataclasses.asdict(self), "model": self.model_name, **dataclasses.asdict(self.optimizer_settings),
                "synthetic_size": synthetic, **self.defaulted_options(), "timeline_dir": self.timeline_folder,
                "tracking_uri": redact_uri(self.tracking_uri)}

    def defaulted_options(self) -> dict:
        """--bucket-mb and PowerSGD's flags as the job runs them: given, or their defaults where its method or
        compressor reads them; left unset where nothing does (and under --sync auto, until the advice is applied)."""
        reads = functools.partial(reads_option, self.sync, self.compression) if self.sync in SYNC_METHODS else None
        rank, start = self.powersgd_settings
        resolved = {"bucket_mb": self.bucket_size_mb, "powersgd_rank": rank, "powersgd_start_step": start}
        return {name: value if reads and reads(name) else getattr(self, name) for name, value in resolved.items()}

    def validate(self, world_size: int) -> None:
        """Reject values no run can use, before any work starts (validation.py)."""
        validate(self, world_size)

    def validate_model(self) -> tuple[int, ...]:
        """The model's flags: gpt's sizes in range, and a model that resolves and takes the data set's samples. Returns
        what it takes per sample. Every command that builds the model (train, bench, advise, predict, gpu-check)
        asks this."""
        for flag, value in {"--gpt-layers": self.gpt_layers, "--gpt-heads": self.gpt_heads,
                            "--gpt-width": self.gpt_width, "--context": self.context}.items():
            if value is not None and value <= 0:
                raise UserError(f"{flag} must be positive, got {value}.")
        given = {"--gpt-size": self.gpt_size != TrainConfig.gpt_size, "--gpt-layers": self.gpt_layers,
                 "--gpt-heads": self.gpt_heads, "--gpt-width": self.gpt_width}
        shaping = [flag for flag, value in given.items() if value not in (None, False)]
        if shaping and self.model_name != "gpt":
            one = len(shaping) == 1
            raise UserError(f"{', '.join(shaping)} {'shapes' if one else 'shape'} --model gpt, and this job trains "
                            f"--model {self.model_name}, which would ignore {'it' if one else 'them'}. Drop "
                            f"{'it' if one else 'them'}, or train --model gpt.")
        if self.context is not None and not self.language_model:
            raise UserError(f"--context is the length of the token sequences a language model reads, and --model "
                            f"{self.model_name} takes images, which would ignore it. Drop it, or train --model gpt "
                            f"on --dataset text.")
        gpt_shape = self.gpt_shape
        if gpt_shape.width % gpt_shape.heads:
            raise UserError(f"--gpt-width {gpt_shape.width} must split evenly across --gpt-heads {gpt_shape.heads}. "
                            f"Use a width that is a multiple of {gpt_shape.heads}, or other heads.")
        if self.model_name == "gpt":
            refuse_weights_beyond_host(gpt_shape)
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

    def default_run_name(self, world_size: int) -> str:
        return self.run_name or f"{label(self.sync, self.compression)}-np{world_size}-seed{self.seed}"

    def per_rank(self, world_size: int) -> int:
        """Each rank's share of the global batch (validate() guarantees it divides)."""
        return self.batch_size // world_size

    def micro_batch(self, world_size: int) -> int:
        """What each rank's forward and backward take at once: its share over --accumulate."""
        return self.per_rank(world_size) // self.accumulate


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
