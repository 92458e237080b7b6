"""The interface every gradient-sync method implements."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn

from ..timeline import NO_RECORDER, Recorder, coded, timed
from .compression import COMPRESSORS, Compressor
from .compression.none import NoCompression
from .messages import DDP_BUCKET_MB, DDP_FIRST_BUCKET_MB, ONE_BUFFER

EVERY_COMPRESSION = tuple(COMPRESSORS)
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


def gradients(model: nn.Module) -> list[torch.Tensor]:
    """The .grad of every parameter that has one, in registration order (the same on every rank)."""
    return [p.grad for p in model.parameters() if p.grad is not None]


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (fsdp's parameters and gradients), any other tensor itself. DTensor is looked
    up only once torch has loaded it, as a job that shards does: importing it costs every process 0.6 s."""
    dtensors = sys.modules.get("torch.distributed.tensor")
    return tensor.to_local() if dtensors is not None and isinstance(tensor, dtensors.DTensor) else tensor


def sum_each_round(rounds: Iterator[torch.Tensor], allreduce_sum: Callable[[torch.Tensor], None],
                   recorder: Recorder = NO_RECORDER, name: str = "allreduce", bucket: int | None = None) -> None:
    """Drive a compressor's rounds to the end, summing each message across ranks before the next; for a recorder
    that wants them, each sum is a message and, in a timeline, the compressor's work between them a codec interval."""
    while True:
        message = coded(recorder, next, rounds, None, bucket=bucket)
        if message is None:
            return
        timed(recorder, name, message.numel() * message.element_size(), allreduce_sum, message, bucket=bucket)


@dataclass(frozen=True)
class AccuracyCost:
    """Test accuracy of a lossy option against allreduce's, in points, as measured in this project."""

    points: float
    measured: str  # what was run
    source: str  # where its figures are (docs/results.md#...)
    settings: tuple[tuple[str, object], ...] = ()  # TrainConfig fields it ran with beyond its label's defaults


class SyncMethod:
    """Keeps every rank's model the one the job stands for: a gradient method averages the gradients at every
    step (`averages` GRADIENTS), a model-averaging method the parameters every few steps (PARAMETERS).

    A method is a schedule (who sends what to whom, when) carrying a compressor (what
    the messages hold, see compression/). Everything the cost model, the bench, compare and
    predict need to know about it is a class attribute here: its collective family, how its
    gradients travel (`messages`), when they go (`sends`), what they carry (`wire_bytes`).
    `compressions` lists the --compression values its schedule can carry; a name that stands
    for one schedule with one compression (`flat_fp16`) sets `fixed_compression`.
    `unsupported_backends` maps a backend to why the method cannot run there, so a job is
    refused before it starts.
    """

    collective: str | None = None  # its family: a key of netmodel/families.py ("ring", "root", "hierarchical",
    # "reduce_scatter": gradients reduce-scattered then parameters all-gathered; "layerwise_gather": FSDP's gathers
    # around each unit's forward and backward; "ring_then_broadcast": DDP's allreduce, then each shard's owner sends
    # its updated parameters)
    shards: str = REPLICATED  # what each rank keeps only 1/N of: REPLICATED, OPTIMIZER_STATE, ...
    messages: str = ONE_BUFFER  # PER_TENSOR, ONE_BUFFER or BUCKETS (messages.py)
    sends: str = AFTER_BACKWARD  # AFTER_BACKWARD, DURING_BACKWARD, INSIDE_DDP or AFTER_STEP
    # a compressor's later rounds (PowerSGD's Qs) wait for sync(), after backward, where DURING_BACKWARD sends only
    # the first; False where they follow the first as soon as its sum is in (torch's PowerSGD hook chains them)
    later_rounds_after_backward: bool = False
    averages: str = GRADIENTS  # GRADIENTS at every step, or PARAMETERS every few steps (averaging.py)
    wire_dtype: torch.dtype | None = None  # what its messages carry, when not the gradients' own dtype (compression)
    compressions: tuple[str, ...] = ("none",)
    tunables: ClassVar[tuple[str, ...]] = ()  # the TrainConfig fields it reads (bucket_mb, period, ...): the
    # advisor searches them, training refuses them for a method that would ignore them
    fixed_compression: str | None = None
    # (model, compression) -> its test accuracy against allreduce's, as measured: the advisor lists it beside a lossy
    # option of this method (a method that averages models; compressions of the gradient methods: commands/advise.py)
    accuracy_costs: ClassVar[dict[tuple[str, str], AccuracyCost]] = {}
    unsupported_backends: ClassVar[dict[str, str]] = {}
    # where it overlaps its messages with compute only on CUDA (on a side stream), why it does not on CPU: the model
    # prices the overlap; on CPU the step pays all of its communication (predict says so)
    overlaps_only_on_cuda: ClassVar[str | None] = None
    # completes "cannot carry --compression X:"
    no_compression_because = "its schedule has no sum of gradients to compress"

    # what the last step synchronised: "all" ranks (every step of a gradient method), the ranks of each "host"
    # (two-level local SGD), or None (a local step); the bytes a job counts as sent follow it
    last_sync: str | None = "all"
    recorder: Recorder = NO_RECORDER  # where it notes its messages (timeline.py); none unless the job asks

    def record_into(self, recorder: Recorder) -> None:
        """Note messages (and a compressor's work) in `recorder` from now on."""
        self.recorder = recorder

    def state_dict(self, model: nn.Module) -> dict:
        """This rank's state that outlives a step (a compressor's memory), for a checkpoint: a resumed job that
        takes it back continues exactly."""
        return {"compressor": self.compressor.state_dict({id(p): i for i, p in enumerate(model.parameters())})}

    def load_state_dict(self, state: dict, model: nn.Module) -> None:
        self.compressor.load_state_dict(state.get("compressor") or {}, list(model.parameters()))

    def __init__(self, compressor: Compressor | None = None):
        self.compressor = compressor or NoCompression()
        if self.compressor.wire_dtype is not None:
            self.wire_dtype = self.compressor.wire_dtype

    @classmethod
    def overlapped(cls) -> bool:
        """Communicates while backward runs: only what outlasts backward costs the step (its exposed time)."""
        return cls.sends in (DURING_BACKWARD, INSIDE_DDP, INSIDE_FSDP)

    @classmethod
    def inside_ddp(cls) -> bool:
        """Communicates inside torch's wrapper (DistributedDataParallel and its variants, FSDP): its buckets and
        compression are torch's, its sync() is empty, its sync time cannot be measured apart from compute's."""
        return cls.sends in (INSIDE_DDP, INSIDE_FSDP)

    def bucket_caps(self) -> tuple[float, float]:
        """Bytes of its first bucket and of the others, for a method that sends buckets (DDP's defaults)."""
        return DDP_FIRST_BUCKET_MB * 2**20, DDP_BUCKET_MB * 2**20

    def wire_ratio(self, params: Sequence[nn.Parameter]) -> float:
        """Bytes on the wire per gradient byte for these parameters (fp16: 0.5; PowerSGD: its factors)."""
        gradient_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
        return self.wire_bytes(params) / gradient_bytes if gradient_bytes else 1.0

    def later_share(self, params: Sequence[nn.Parameter]) -> float:
        """The share of its wire bytes its compressor sums after the first round (PowerSGD's Qs; else 0)."""
        return self.compressor.later_share([p for p in params if p.requires_grad])

    @classmethod
    def from_config(cls, config) -> SyncMethod:
        """The method as the training job configures it (methods with options read their flags here)."""
        return cls(cls.compressor_from_config(config))

    @classmethod
    def compression_name(cls, requested: str = "none") -> str:
        """The compression a job with --compression `requested` runs (a fixed one wins; the pair is checked up
        front)."""
        return cls.fixed_compression or requested

    @classmethod
    def compressor_from_config(cls, config) -> Compressor:
        return COMPRESSORS[cls.compression_name(getattr(config, "compression", "none"))].from_config(config)

    def wire_bytes(self, params: Sequence[nn.Parameter]) -> float:
        """S of the cost model: bytes each step's sums carry for these parameters, as this method sends them."""
        return self.compressor.wire_bytes([p for p in params if p.requires_grad])

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module to run forward/backward on (a wrapper may hook into backward)."""
        return model

    def sync(self, model: nn.Module) -> None:
        """Called after backward, before the optimizer step: average the gradients."""
        raise NotImplementedError

    def after_step(self, model: nn.Module) -> bool:
        """Called after the optimizer step: a method that averages parameters does so here when it is due. True
        when it communicated (the step's sync then ends here)."""
        return False

    def replicated(self, model: nn.Module) -> list[torch.Tensor]:
        """The tensors every rank must hold identically after any step (the replica check compares them): the
        parameters for a method that averages gradients; a model-averaging method's last average."""
        return list(model.parameters())

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Tensors this method keeps beyond the model's parameters, their .grad and the optimizer's state (a flat
        gradient buffer, a shard's copy), by what they are ("parameters", "gradients", "optimizer"): memory per
        rank counts them."""
        return {}

    def use_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """The job's optimizer, for a method that must reach its state (local SGD's momentum buffers)."""

    def make_optimizer(self, model: nn.Module, build: Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
                       ) -> torch.optim.Optimizer:
        """The job's optimizer, made by `build` from the tensors it steps: the model's parameters, or for a method
        that shards the optimizer state, the tensors of this rank's shard (the object returned holds that state)."""
        return build(model.parameters())

    def optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> dict | None:
        """Collective: the optimizer's state as one unsharded optimizer over model.parameters() would hold it (its
        state_dict), on rank 0 at least, so that a checkpoint resumes under any method and world size."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict, model: nn.Module) -> None:
        """Take back what optimizer_state gave (every rank has the whole of it): a sharding method keeps its shard."""
        optimizer.load_state_dict(state)

    def model_state(self, model: nn.Module) -> dict | None:
        """Collective: the model's whole state_dict on CPU, on rank 0 at least (a method that shards the parameters
        gathers them)."""
        return {key: value.detach().cpu().clone() for key, value in model.state_dict().items()}

    def load_model_state(self, model: nn.Module, state: dict) -> None:
        """Take back what model_state gave (every rank has the whole of it)."""
        model.load_state_dict(state)

    def whole_parameters(self, model: nn.Module) -> list[torch.Tensor]:
        """Collective: every parameter whole, on every rank (what the end's weights digest hashes)."""
        return list(model.parameters())

    def finish(self, model: nn.Module) -> bool:
        """The last step is done (collective): a method whose ranks may hold different models makes them one. True
        when it communicated."""
        return False

    def evaluated(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Around a test evaluation (collective): the model every rank scores is the one the job stands for."""
        return contextlib.nullcontext()

    def start_at(self, step: int) -> None:
        """The job resumes after `step` optimizer steps (a method that counts steps takes up its count)."""

    def figures(self) -> dict:
        """Per-rank figures this method adds to a logged step (local SGD's drift), taken once."""
        return {}

    def accumulating(self, net: nn.Module) -> contextlib.AbstractContextManager:
        """Around the forward and backward of a micro-batch that is not a step's last (--accumulate): its gradients
        only add up, nothing is sent. A method that syncs after backward has nothing to hold back; one that sends
        from backward holds its hooks (DDP: no_sync())."""
        return contextlib.nullcontext()

    def sync_buffers(self, model: nn.Module) -> None:
        """Average floating-point buffers (BatchNorm running statistics) so evaluation sees one model."""
        world = dist.get_world_size()
        for buffer in model.buffers():
            if buffer.is_floating_point():
                dist.all_reduce(buffer)
                buffer.div_(world)
