"""What a sync method is, as one frozen value: everything the cost model, the advisor, the bench and the config
checks read about a method, declared in one place rather than read off its runtime object.

Each method class declares `traits = Traits(...)`; a subclass builds on its parent's with
dataclasses.replace. A configured method's instance carries its class's traits with what its
options set (a bucket size, an averaging period, a compressor's wire dtype): `configured(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from .messages import DDP_BUCKET_MB, DDP_FIRST_BUCKET_MB, ONE_BUFFER

# when a method sends (`sends`)
AFTER_BACKWARD = "after backward"  # in the sync phase, once backward is done
DURING_BACKWARD = "during backward"  # from our own hooks while backward runs; sync() waits for what is left
INSIDE_DDP = "inside DDP"  # torch's DistributedDataParallel and its comm hooks; sync() has nothing left to do
INSIDE_FSDP = "inside FSDP"  # torch's fully_shard: gathers in forward and backward, reduce-scatters in backward
AFTER_STEP = "after the optimizer step"  # model averaging: parameters, every few steps, in after_step()
GRADIENTS, PARAMETERS = "gradients", "parameters"  # what a method averages (`averages`)
# what a method keeps only 1/N of on each rank (`shards`), ZeRO's stages 0-3: the memory per rank it buys
REPLICATED = "nothing"  # every rank holds whole parameters, gradients and optimizer state
OPTIMIZER_STATE = "optimizer state"  # ZeRO-1
GRADIENTS_AND_STATE = "gradients and optimizer state"  # ZeRO-2
EVERYTHING = "parameters, gradients and optimizer state"  # ZeRO-3 (FSDP)
DDP_BUCKET_CAPS = (DDP_FIRST_BUCKET_MB * 2**20, DDP_BUCKET_MB * 2**20)  # bytes: first bucket, the others
# the collective families (`family`), keys of netmodel/families.py, named apart from the methods that use them
RING_ALLREDUCE = "ring_allreduce"  # bandwidth-optimal allreduce (ring, or reduce-scatter + all-gather)
ROOT = "root"  # gather to rank 0, scatter back
TWO_LEVEL = "two_level"  # reduce in each host, allreduce among the host leaders, broadcast in each host
REDUCE_SCATTER = "reduce_scatter"  # ZeRO-2: gradients reduce-scattered, then parameters all-gathered
LAYERWISE_GATHER = "layerwise_gather"  # ZeRO-3: gathers around each unit's forward and backward
RING_THEN_BROADCAST = "ring_then_broadcast"  # ZeRO-1: DDP's allreduce, then each shard's owner sends its parameters


@dataclass(frozen=True)
class AccuracyCost:
    """Test accuracy of a lossy option against allreduce's, in points, as measured in this project."""

    points: float
    measured: str  # what was run
    source: str  # where its figures are (docs/results.md#...)
    settings: tuple[tuple[str, object], ...] = ()  # TrainConfig fields it ran with beyond its label's defaults


@dataclass(frozen=True)
class Cadence:
    """How often a model-averaging method averages, as the cost model prices it: every `period` steps, a 1/F share
    of the model (`fragments`), in the background (`overlap`), with the hosts' own averages every `host_period`."""

    period: int
    fragments: int = 1
    host_period: int = 0
    overlap: bool = False

    @property
    def every(self) -> int:
        """Steps between two averages across hosts: the period, or period/F with F fragments."""
        return self.period // self.fragments


@dataclass(frozen=True)
class Traits:
    """What a sync method is. A method is a schedule (who sends what to whom, when) carrying a compressor (what the
    messages hold, compression/); these are the schedule's facts that decisions made before a job runs need."""

    # its collective family: a key of netmodel/families.py (None: the cost model cannot price it)
    family: str | None = None
    shards: str = REPLICATED  # what each rank keeps only 1/N of: REPLICATED, OPTIMIZER_STATE, ...
    messages: str = ONE_BUFFER  # PER_TENSOR, ONE_BUFFER, BUCKETS or PER_UNIT (messages.py)
    sends: str = AFTER_BACKWARD  # AFTER_BACKWARD, DURING_BACKWARD, INSIDE_DDP, INSIDE_FSDP or AFTER_STEP
    # a compressor's later rounds (PowerSGD's Qs) wait for sync(), after backward, where DURING_BACKWARD sends only
    # the first; False where they follow the first as soon as its sum is in (torch's PowerSGD hook chains them)
    later_rounds_after_backward: bool = False
    averages: str = GRADIENTS  # GRADIENTS at every step, or PARAMETERS every few steps (averaging.py)
    compressions: tuple[str, ...] = ("none",)  # the --compression values its schedule can carry
    fixed_compression: str | None = None  # a name that stands for one schedule with one compression (flat_fp16)
    wire_dtype: torch.dtype | None = None  # what its messages carry, when not the gradients' own dtype
    # what its all-gathers carry the parameters in, when not their own dtype (fsdp's mixed-precision policy)
    gathered_dtype: torch.dtype | None = None
    # the TrainConfig fields it reads: the advisor searches them, training refuses them for a method that ignores them
    tunables: tuple[str, ...] = ()
    # (model, compression) -> its test accuracy against allreduce's, as measured: the advisor lists it beside a lossy
    # option of a method that averages models
    accuracy_costs: dict[tuple[str, str], AccuracyCost] = field(default_factory=dict, compare=False)
    # backend -> why the method cannot run there, so a job is refused before it starts
    unsupported_backends: dict[str, str] = field(default_factory=dict, compare=False)
    # why it overlaps its messages with compute only on CUDA (on a side stream): on CPU the step pays all of them
    overlaps_only_on_cuda: str | None = None
    no_compression_because: str = "its schedule has no sum of gradients to compress"  # "cannot carry X: ..."
    keeps_parameter_shard: bool = False  # steps a flat 1/N of the parameters beside the whole ones (zero)
    bucket_caps: tuple[float, float] = DDP_BUCKET_CAPS  # bytes of its first bucket and the others (BUCKETS)
    cadence: Cadence | None = None  # a model-averaging method's, once configured
    # what --compile takes from its overlap, in words, where it does (docs/sync-methods.md, "Under --compile"): a
    # compiled backward hands over every gradient at its end, so hooks of our own fire there (torch's DDPOptimizer
    # cuts the graph at DDP's buckets only); the job's console, summary, timeline and cost model say it
    lost_when_compiled: str | None = None

    def overlapped(self) -> bool:
        """Communicates while backward runs: only what outlasts backward costs the step (its exposed time)."""
        return self.sends in (DURING_BACKWARD, INSIDE_DDP, INSIDE_FSDP)

    def inside_ddp(self) -> bool:
        """Communicates inside torch's wrapper (DistributedDataParallel and its variants, FSDP): its buckets and
        compression are torch's, its sync() is empty, its sync time cannot be measured apart from compute's."""
        return self.sends in (INSIDE_DDP, INSIDE_FSDP)

    def compression_name(self, requested: str = "none") -> str:
        """The compression a job with --compression `requested` runs (a fixed one wins; the pair is checked up
        front)."""
        return self.fixed_compression or requested

    def configured(self, **options) -> Traits:
        """These traits with what a configured method's options set (bucket_caps, cadence, wire_dtype, family,
        gathered_dtype)."""
        return replace(self, **options)


TRAIT_NAMES = frozenset(Traits.__dataclass_fields__) | {"overlapped", "inside_ddp", "compression_name"}
