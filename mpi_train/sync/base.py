"""The interface every gradient-sync method implements: a frozen `Traits` value that says what the method is
(traits.py), and the runtime hooks the training loop, the bench and checkpoints call."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from ..timeline import NO_RECORDER, Recorder, coded, timed
from .compression import COMPRESSORS, Compressor
from .compression.none import NoCompression
from .traits import (
    AFTER_BACKWARD,
    AFTER_STEP,
    DURING_BACKWARD,
    EVERYTHING,
    GRADIENTS,
    GRADIENTS_AND_STATE,
    INSIDE_DDP,
    INSIDE_FSDP,
    OPTIMIZER_STATE,
    PARAMETERS,
    REPLICATED,
    TRAIT_NAMES,
    AccuracyCost,
    Traits,
)

EVERY_COMPRESSION = tuple(COMPRESSORS)
# re-exported: the methods and the modules that read their traits import these from here
__all__ = ["AFTER_BACKWARD", "AFTER_STEP", "DURING_BACKWARD", "EVERYTHING", "EVERY_COMPRESSION", "EVERY_STEP",
           "GRADIENTS", "GRADIENTS_AND_STATE", "HELD_VIEW", "INSIDE_DDP", "INSIDE_FSDP", "OPTIMIZER_STATE",
           "PARAMETERS", "REPLICATED", "REPLICATED_VIEW", "VIEWS", "WHOLE_VIEW", "AccuracyCost", "SyncMethod", "Synced",
           "Traits", "average_buffers", "compressor_for", "gradients", "local_part", "sum_each_round"]


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


def compressor_for(method: type[SyncMethod], config) -> Compressor:
    """The compressor a job's config gives `method`: its fixed one, else --compression's, with its flags."""
    requested = getattr(config, "compression", "none")
    return COMPRESSORS[method.traits.compression_name(requested)].from_config(config)


def average_buffers(model: nn.Module) -> None:
    """Collective: average floating-point buffers (BatchNorm running statistics) so evaluation sees one model."""
    world = dist.get_world_size()
    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer)
            buffer.div_(world)


# what `SyncMethod.tensors` gives
REPLICATED_VIEW = "replicated"  # what every rank must hold identically after any step
WHOLE_VIEW = "whole"  # collective: every parameter whole, on every rank
HELD_VIEW = "held "  # + "parameters", "gradients" or "optimizer": the method's own tensors of that kind
VIEWS = (REPLICATED_VIEW, WHOLE_VIEW, *(HELD_VIEW + kind for kind in ("parameters", "gradients", "optimizer")))


@dataclass(frozen=True)
class Synced:
    """What a step synchronised, as after_step reports it: the job counts the bytes it sent by `scope`."""

    # "all" ranks (every step of a gradient method), the ranks of each "host" (two-level local SGD), "gradients" (a
    # model-averaging method's warm-up) or None (a local step)
    scope: str | None = "all"
    averaged: bool = False  # after_step itself communicated: the step's sync ends there
    figures: dict = field(default_factory=dict)  # per-rank figures for the next logged step (local SGD's drift)


EVERY_STEP = Synced()


class SyncMethod:
    """Keeps every rank's model the one the job stands for: a gradient method averages the gradients (`averages`
    GRADIENTS), at every step; a model-averaging method the parameters (PARAMETERS), every few steps.

    What a method is, its `traits`, is one frozen value (traits.py) that the cost model, the
    advisor, the bench and the config checks read before any rank runs; a configured instance
    carries its class's traits with what its options set. What runs is thirteen public members:
    its `compressor`, the hooks the training loop calls around each step (record_into, wrap,
    make_optimizer, accumulating, sync, after_step, finish, evaluated) and around the whole loop
    (explaining: a failure of its own machinery said as the user's fault it is), the checkpoint pair
    (save, load) and the views a check or a count reads (tensors). The underscored hooks behind
    the last three are what a sharding or model-averaging method overrides.
    """

    traits = Traits()

    def __init__(self, compressor: Compressor | None = None):
        self.compressor = compressor or NoCompression()
        self._recorder: Recorder = NO_RECORDER  # where it notes its messages (timeline.py); none unless asked
        if self.compressor.wire_dtype is not None:
            self.traits = self.traits.configured(wire_dtype=self.compressor.wire_dtype)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # a trait set as a class attribute would be read by nobody: the readers look in `traits`
        stray = sorted(TRAIT_NAMES & {name for name, value in vars(cls).items() if not callable(value)})
        if stray:
            raise TypeError(f"{cls.__name__} sets {', '.join(stray)} as class attributes: declare them in its "
                            f"`traits` (sync/traits.py)")

    @classmethod
    def _from_config(cls, config) -> SyncMethod:
        """The method as the training job configures it (methods with options read their flags here); callers build
        one with sync.build_method(name, config)."""
        return cls(compressor_for(cls, config))

    # -- the runtime interface: what the loop, the bench and checkpoints call ------------------------------------------

    def record_into(self, recorder: Recorder) -> None:
        """Note messages (and a compressor's work) in `recorder` from now on."""
        self._recorder = recorder

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module to run forward/backward on (a wrapper may hook into backward)."""
        return model

    def make_optimizer(self, model: nn.Module, build: Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
                       ) -> torch.optim.Optimizer:
        """The job's optimizer, made by `build` from the tensors it steps: the model's parameters, or for a method
        that shards the optimizer state, the tensors of this rank's shard (the object returned holds that state)."""
        return build(model.parameters())

    def accumulating(self, net: nn.Module) -> contextlib.AbstractContextManager:
        """Around the forward and backward of a micro-batch that is not a step's last (--accumulate): its gradients
        only add up, nothing is sent. A method that syncs after backward has nothing to hold back; one that sends
        from backward holds its hooks (DDP: no_sync())."""
        return contextlib.nullcontext()

    def explaining(self) -> contextlib.AbstractContextManager:
        """Around the training loop: a failure in the method's own machinery that the user's model caused, said as
        one paragraph (a UserError) where the method knows what it means; nothing by default."""
        return contextlib.nullcontext()

    def sync(self, model: nn.Module) -> None:
        """Called after backward, before the optimizer step: average the gradients."""
        raise NotImplementedError

    def after_step(self, model: nn.Module) -> Synced:
        """Called after the optimizer step: a method that averages parameters does so here when it is due. What the
        step synchronised: the loop counts its bytes and logs its figures."""
        return EVERY_STEP

    def finish(self, model: nn.Module) -> bool:
        """The last step is done (collective): a method whose ranks may hold different models makes them one. True
        when it communicated."""
        return False

    def evaluated(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Around a test evaluation (collective): the model every rank scores is the one the job stands for."""
        return contextlib.nullcontext()

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """Collective: what a checkpoint keeps. "method": this rank's own state that outlives a step (a compressor's
        memory, a model-averaging rank's own model); "model" and "optimizer": the whole model's state_dict on CPU and
        the optimizer's state as one unsharded optimizer over model.parameters() would hold it, on rank 0 at least, so
        that a checkpoint resumes under any method and world size. Without an optimizer, the "model" alone (a saved
        model's weights)."""
        if optimizer is None:
            return {"model": self._model_state(model)}
        return {"method": self._own_state(model), "model": self._model_state(model),
                "optimizer": self._optimizer_state(optimizer, model)}

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, state: dict,
             step: int | None = None) -> None:
        """Take back what save gave, whichever parts `state` holds: a resumed job takes the whole "model" and
        "optimizer" (every rank has them; a sharding method keeps its share) and the `step` count at setup, and each
        rank its own "method" state right before its first batch, after its random state."""
        if "model" in state:
            self._load_model_state(model, state["model"])
        if "optimizer" in state:
            self._load_optimizer_state(optimizer, state["optimizer"], model)
        if step is not None:
            self._start_at(step)
        if "method" in state:
            self._load_own_state(state["method"] or {}, model)

    def tensors(self, model: nn.Module, which: str) -> list[torch.Tensor]:
        """The tensors a check or a count reads, by `which` (VIEWS): REPLICATED_VIEW, what every rank must hold
        identically after any step (the replica check); WHOLE_VIEW (collective), every parameter whole on every rank
        (the weights digest); "held parameters", "held gradients", "held optimizer", what the method keeps beyond
        the model's parameters, their .grad and the optimizer's state (memory per rank counts them)."""
        if which == REPLICATED_VIEW:
            return self._replicated(model)
        if which == WHOLE_VIEW:
            return self._whole_parameters(model)
        if which.startswith(HELD_VIEW):
            return self._held().get(which.removeprefix(HELD_VIEW), [])
        raise ValueError(f"tensors: {which!r} is not one of {', '.join(VIEWS)}")

    # -- the hooks a method overrides behind that interface ------------------------------------------------------------

    def _own_state(self, model: nn.Module) -> dict:
        """This rank's state that outlives a step (a compressor's memory): a resumed job that takes it back continues
        exactly."""
        return {"compressor": self.compressor.state_dict({id(p): i for i, p in enumerate(model.parameters())})}

    def _load_own_state(self, state: dict, model: nn.Module) -> None:
        self.compressor.load_state_dict(state.get("compressor") or {}, list(model.parameters()))

    def _model_state(self, model: nn.Module) -> dict | None:
        """Collective: the model's whole state_dict on CPU, on rank 0 at least (a method that shards the parameters
        gathers them)."""
        return {key: value.detach().cpu().clone() for key, value in model.state_dict().items()}

    def _load_model_state(self, model: nn.Module, state: dict) -> None:
        model.load_state_dict(state)

    def _optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> dict | None:
        """Collective: the optimizer's state_dict as one unsharded optimizer over model.parameters() would hold it."""
        return optimizer.state_dict()

    def _load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict, model: nn.Module) -> None:
        """Take back what _optimizer_state gave (every rank has the whole of it): a sharding method keeps its shard."""
        optimizer.load_state_dict(state)

    def _start_at(self, step: int) -> None:
        """The job resumes after `step` optimizer steps (a method that counts steps takes up its count)."""

    def _replicated(self, model: nn.Module) -> list[torch.Tensor]:
        """The parameters for a method that averages gradients; a model-averaging method's last average."""
        return list(model.parameters())

    def _whole_parameters(self, model: nn.Module) -> list[torch.Tensor]:
        return list(model.parameters())

    def _held(self) -> dict[str, list[torch.Tensor]]:
        """Its own tensors by what they are ("parameters", "gradients", "optimizer"): a flat gradient buffer, a
        shard's copy."""
        return {}
