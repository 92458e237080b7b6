"""The registry of gradient-sync methods, keyed by their --sync names; their labels; the checks on what they carry.

Adding a method: one file in this folder with a SyncMethod subclass that declares its `traits`
(traits.py) and its runtime hooks (base.py), and its entry in SYNC_METHODS below (with its import). Training, the
bench, experiment files' `sync = "all"`, compare and predict all read it from here.
Adding a compressor: one file in compression/, one entry in its registry.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UserError
from .allreduce import AllReduce
from .averaging_options import AveragingOptions
from .base import GRADIENTS, PARAMETERS, REPLICATED_VIEW, WHOLE_VIEW, Synced, SyncMethod, average_buffers
from .bucketed import Bucketed, BucketOptions
from .compression import COMPRESSORS, CompressionChoice
from .compression.powersgd import PowerSGDOptions
from .ddp import DDP
from .ddp_fp16 import DDPFP16
from .ddp_powersgd import DDPPowerSGD
from .diloco import DiLoCo, OuterStepOptions
from .flag_fields import option_names
from .flat import Flat
from .flat_fp16 import FlatFP16
from .fsdp import FSDP
from .gather_scatter import GatherScatter
from .hierarchical import Hierarchical
from .localsgd import LocalSGD
from .ring import Ring
from .zero import Zero
from .zero_torch import ZeroTorch

SYNC_METHODS: dict[str, type[SyncMethod]] = {
    "gather_scatter": GatherScatter,
    "allreduce": AllReduce,
    "ddp": DDP,
    "flat": Flat,
    "bucketed": Bucketed,
    "ring": Ring,
    "hierarchical": Hierarchical,
    "flat_fp16": FlatFP16,
    "ddp_fp16": DDPFP16,
    "ddp_powersgd": DDPPowerSGD,
    "localsgd": LocalSGD,
    "diloco": DiLoCo,
    "zero": Zero,
    "fsdp": FSDP,
    "zero_torch": ZeroTorch,
}


# The methods' own flags, each class a small frozen dataclass in its method's file, in the order --help lists them,
# with the check that refuses their bad values (called with the job's whole TrainConfig, which composes every class
# here; None: checked with the method it goes with). A method with flags of its own adds its line here.
METHOD_OPTIONS: tuple[tuple[type, Callable | None], ...] = (
    (BucketOptions, BucketOptions.check_buckets),
    (CompressionChoice, None),
    (PowerSGDOptions, PowerSGDOptions.check_powersgd),
    (AveragingOptions, AveragingOptions.check_averaging),
    (OuterStepOptions, OuterStepOptions.check_outer_step),
)


def build_method(name: str, config) -> SyncMethod:
    """The method --sync `name` names, configured by a job's config (its own options, its compressor's flags)."""
    return SYNC_METHODS[name]._from_config(config)


BASELINE = "ddp"  # torch's DDP: what every user would otherwise run, measured beside every other


def tuned_by(field: str) -> list[str]:
    """The methods that read TrainConfig's `field` (their class's tunables): `tuned_by("period")` -> ["localsgd",
    "diloco"]."""
    return [name for name, method in SYNC_METHODS.items() if field in method.traits.tunables]


def compressions_tuned_by(field: str) -> list[str]:
    """The compressions that read TrainConfig's `field`: `compressions_tuned_by("powersgd_rank")` -> ["powersgd"]."""
    return [name for name, compressor in COMPRESSORS.items() if field in compressor.tunables]


def method_option_names() -> tuple[str, ...]:
    """The TrainConfig fields the methods' and compressors' option classes declare (--compression itself aside)."""
    return tuple(name for options, _ in METHOD_OPTIONS if options is not CompressionChoice
                 for name in option_names(options))


def reads_option(sync: str, compression: str, field: str) -> bool:
    """Whether a job of --sync `sync` and --compression `compression` reads TrainConfig's `field`: the method does,
    or the compressor it runs (a fixed one, as ddp_powersgd's, or the one asked for)."""
    method = SYNC_METHODS[sync]
    return field in method.traits.tunables or field in COMPRESSORS[method.traits.compression_name(compression)].tunables


def label(sync: str, compression: str = "none") -> str:
    """How a run is named and shown: `bucketed+powersgd`; a method alone when it sends gradients as they are
    or its name already says how it compresses (`flat_fp16`, `ddp_powersgd`)."""
    method = SYNC_METHODS.get(sync)
    if compression == "none" or (method is not None and method.traits.fixed_compression):
        return sync
    return f"{sync}+{compression}"


def split_label(text: str) -> tuple[str, str]:
    """The inverse of `label`: `bucketed+powersgd` -> ("bucketed", "powersgd"); `flat_fp16` -> ("flat_fp16", "none")."""
    name, _, compression = text.partition("+")
    return name, compression or "none"


def every_label() -> list[str]:
    """Each registered method, then each compression its schedule carries: ring, ring+fp16, ring+bf16, ..."""
    return [label(name, compression) for name, method_class in SYNC_METHODS.items()
            for compression in ("none", *(c for c in method_class.traits.compressions
                                          if c != "none" and not method_class.traits.fixed_compression))]


def parse_labels(text: str | None) -> list[str]:
    """The labels a comma-separated list names (`ddp,bucketed+powersgd`), each checked; every label for None."""
    if text is None:
        return every_label()
    labels = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    for one in labels:
        name, compression = split_label(one)
        if name not in SYNC_METHODS:
            raise UserError(f"--methods: {name!r} is not a sync method; choose from {', '.join(every_label())}.")
        refused = combination_error(name, compression)
        if refused:
            raise UserError(f"--methods: {one} cannot run: {refused}")
    if not labels:
        raise UserError("--methods names no method; e.g. --methods ddp,bucketed,bucketed+powersgd.")
    return labels


def combination_error(sync: str, compression: str) -> str | None:
    """Why --sync `sync` cannot carry --compression `compression`, or None when it can."""
    traits = SYNC_METHODS[sync].traits
    if compression not in COMPRESSORS:
        return f"unknown --compression {compression!r}; choose one of {', '.join(COMPRESSORS)}."
    if traits.fixed_compression:
        if compression in ("none", traits.fixed_compression):
            return None
        base = sync.rsplit("_", 1)[0]
        other = (f" For {compression}, use --sync {base} --compression {compression}."
                 if base in SYNC_METHODS and compression in SYNC_METHODS[base].traits.compressions else "")
        return (f"--sync {sync} already compresses with {traits.fixed_compression} and cannot also carry "
                f"--compression {compression}.{other} Or drop --compression.")
    if compression in traits.compressions:
        return None
    carriers = [name for name, m in SYNC_METHODS.items()
                if compression in m.traits.compressions and not m.traits.fixed_compression]
    return (f"--sync {sync} cannot carry --compression {compression}: {traits.no_compression_because}. "
            f"Methods that take --compression {compression}: {', '.join(carriers)}. Drop --compression, or pick one "
            f"of those.")


def backend_error(sync: str, backend: str) -> str | None:
    """Why --sync `sync` cannot run on `backend` ("gloo", "nccl"), or None when it can."""
    reason = SYNC_METHODS[sync].traits.unsupported_backends.get(backend)
    return f"--sync {sync} cannot run on the {backend} backend: {reason}." if reason else None


__all__ = ["COMPRESSORS", "GRADIENTS", "PARAMETERS", "REPLICATED_VIEW", "SYNC_METHODS", "WHOLE_VIEW", "SyncMethod",
           "Synced", "average_buffers", "backend_error", "build_method", "combination_error", "every_label", "label",
           "parse_labels", "split_label"]
