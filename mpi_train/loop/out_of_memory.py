"""A rank that runs out of memory: where it was, with what batch, and what to change, in one paragraph.

On a GPU this is the fault users meet most (a batch or a model too large for the device); torch raises it from
deep inside a layer, and its traceback names the layer, not the flag to change. One rank may meet it alone (a
smaller GPU, another job on it), so the paragraph is that rank's, and the job stops on every rank (rankguard.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..cluster import Cluster
from ..config import TrainConfig
from ..errors import UserError
from ..memory import host_memory, ran_out, shortfall, size
from ..optimizers import state_slots

SCORED_BATCH = 256  # the least a test batch holds per rank (data/loaders.py): scoring keeps no activations


@contextmanager
def said_in_one_paragraph(config: TrainConfig, cluster: Cluster):
    """Around a job: an allocation that fails for want of memory becomes this rank's paragraph, without traceback."""
    try:
        yield
    except Exception as error:
        if not ran_out(error):
            raise
        raise UserError(paragraph(config, cluster, error), collective=False) from None


@dataclass(frozen=True)
class Shortage:
    """What the paragraph's advice depends on."""

    config: TrainConfig
    world_size: int
    per_rank: int  # each rank's share of the batch
    micro: int  # what its forward and backward take at once
    step: float  # as Cluster.note_progress last recorded it: 0 while setting up, n + 0.5 while scoring after n
    on_gpu: bool
    held: int  # the model's parameters, gradients and optimizer state, in bytes
    room: int | None  # the device's memory in all, where known (the GPU's, else the host's)

    @property
    def model_alone(self) -> bool:
        """The model's own state cannot fit the device, whatever the batch (sharded over the ranks, it might)."""
        return self.room is not None and self.held >= self.room

    @property
    def scoring(self) -> bool:
        return self.step != int(self.step)


def paragraph(config: TrainConfig, cluster: Cluster, error: BaseException) -> str:
    """`ran out of memory in step 3: one allocation asked for 1.20 GiB, ... Lower --batch-size, or ...`."""
    info = cluster.info
    on_gpu = isinstance(error, torch.OutOfMemoryError) or "CUDA" in str(error)
    short = Shortage(config=config, world_size=info.world_size, per_rank=config.per_rank(info.world_size),
                     micro=config.micro_batch(info.world_size), step=cluster.step_reached, on_gpu=on_gpu,
                     held=model_state_bytes(config), room=device_bytes(on_gpu))
    unit = f"sequences of {config.gpt_shape.context} tokens" if config.language_model else "images"
    if short.step == 0:
        where = "while setting up, before the first step"
    elif short.scoring:
        where = f"scoring the test set after step {int(short.step)}"
    else:
        where = f"in step {int(short.step)}"
    share = (f"its {short.per_rank:,} of the batch of {config.batch_size:,} in {config.accumulate} micro-batches"
             if config.accumulate > 1 else f"its share of the batch of {config.batch_size:,}")
    said = (f"ran out of memory {where}: {shortfall(error)}. Each rank's forward and backward take {short.micro:,} "
            f"{unit} at once ({share}) through {config.model_name}, and what they keep for backward grows with that "
            f"number.")
    return " ".join(part for part in [said, *(fix(short) for fix in FIXES)] if part)


def smaller_pieces(short: Shortage) -> str:
    """The batch lowered, or kept and taken in more micro-batches (the next --accumulate that divides the share);
    nothing where the model's own state outgrows the device, which no batch mends."""
    if short.model_alone:
        return ""
    if short.scoring:
        return (f"Scoring takes the larger of that share and {SCORED_BATCH} per rank at once: lower --batch-size."
                if short.per_rank > SCORED_BATCH else "")
    more = next((k for k in range(short.config.accumulate + 1, short.per_rank + 1) if short.per_rank % k == 0), None)
    if more is None:
        return "Each rank takes one sample at once already: train a smaller model, or on smaller inputs."
    return (f"Lower --batch-size, or keep it and take each rank's share in smaller pieces with a larger --accumulate "
            f"(--accumulate {more} takes {short.per_rank // more:,} at once; any divisor of {short.per_rank:,} will "
            f"do).")


def lower_precision(short: Shortage) -> str:
    """On a GPU, float32's activations halve under bf16-mixed."""
    return ("--precision bf16-mixed about halves what the activations hold."
            if short.on_gpu and short.config.precision == "32-true" and not short.model_alone else "")


def data_on_host(short: Shortage) -> str:
    """The data set held where the model computes (up to half a GPU under --loader auto) may be what fills it."""
    config = short.config
    held = config.loader != "dataloader" and not config.language_model  # text is always held
    return ("If it is the data set held on the device, --loader dataloader keeps it in the host's memory and brings "
            "it batch by batch." if held and (short.step == 0 or short.on_gpu) else "")


def sharded(short: Shortage) -> str:
    """The model's own parameters, gradients and optimizer state, their size, and the methods that shard them."""
    if short.scoring and not short.model_alone:
        return ""
    held = f"The model's parameters, gradients and optimizer state take {size(short.held)}"
    if short.model_alone:
        return (f"{held}, more than the {size(short.room)} this {'GPU' if short.on_gpu else 'host'} holds in all: no "
                f"batch size fits. Train a smaller model, or shard it over more ranks (--sync fsdp keeps 1/N of it "
                f"on each).")
    return (f"{held} per rank; where that is much of the device, --sync fsdp or zero shards them over the ranks."
            if short.world_size > 1 else f"{held}.")


def device_bytes(on_gpu: bool) -> int | None:
    """The memory of the device that ran out, in all: the current GPU's, else the host's; None where unknown."""
    if on_gpu:
        try:
            return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        except (RuntimeError, AssertionError):  # no CUDA here after all (an error that only says so)
            return None
    host = host_memory()
    return host[1] if host else None


def model_state_bytes(config: TrainConfig) -> int:
    """Parameters, gradients and optimizer state, each the size of the trainable parameters (built on meta)."""
    with torch.device("meta"):
        trained = sum(p.numel() * p.element_size() for p in config.make_model().parameters() if p.requires_grad)
    return trained * (2 + state_slots(config.optimizer_settings))


FIXES: tuple[Callable[[Shortage], str], ...] = (smaller_pieces, lower_precision, data_on_host, sharded)
