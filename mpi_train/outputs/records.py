"""What the reporter hands its outputs: a kind of record with its figures, the job's fixed facts, and the fan-out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..throughput import Throughput

# the kinds of record an output is logged; an epoch's end's evaluation is printed by the epoch's line, not its own
STEP, EPOCH, EVALUATION, EPOCH_EVALUATION, STALL, SUMMARY = "step", "epoch", "eval", "epoch eval", "stall", "summary"
EVALUATIONS = (EVALUATION, EPOCH_EVALUATION)


@dataclass(frozen=True)
class Metrics:
    """One record for every output: its kind, its figures by name as the summary keeps them, and, for a step, each
    rank's figures and each rank's split steps (timeline.split), which the summary's after-warm-up split reads."""

    kind: str
    values: dict
    per_rank: tuple[dict, ...] = ()
    splits: tuple[list, ...] = ()


@dataclass(frozen=True)
class Context:
    """What every output reads of the job and what never changes while it trains."""

    config: dict  # the job's flags, as the summary carries them
    samples_per_step: int  # over every rank: the global batch, or a training set smaller than it, whole
    throughput: Throughput | None = None  # the model's FLOPs per sample and the device's peak: FLOP/s and MFU
    sync_model: object = None  # the alpha-beta model's view of this job (netmodel.JobModel), None on one host
    alignments: tuple = ()  # each rank's clock offset to rank 0's and its error bound (timeline.py)
    steady_from: int = 1  # steps after it count in the steady means
    name: str = "job"

    @property
    def language_model(self) -> bool:
        """A model scored on held-out text: its test loss is a validation loss per byte, with a perplexity."""
        return bool(self.throughput and self.throughput.tokens_per_sample)

    def speed(self, times: dict, world_size: int) -> dict:
        """Samples/s per rank, the data phase's share, FLOP/s per rank and MFU of a step's (or the run's) means."""
        if not self.throughput:
            return {}
        return self.throughput.figures(times, self.samples_per_step, world_size)


class Output(Protocol):
    """Where records go: kept, printed or sent; closed when the training loop ends, after which lines still print."""

    def log(self, metrics: Metrics, step: int) -> None: ...
    def close(self) -> None: ...


class Outputs:
    """Every output of rank 0, each logged and closed in turn: the console first, so that a line is out before
    the tracker takes the figures that follow it."""

    def __init__(self, *outputs: Output):
        self.outputs = outputs

    def log(self, metrics: Metrics, step: int) -> None:
        for output in self.outputs:
            output.log(metrics, step)

    def close(self) -> None:
        for output in self.outputs:
            output.close()
