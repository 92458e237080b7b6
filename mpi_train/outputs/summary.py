"""The summary file: every record of the job kept, and at its end written as one JSON document, part by part."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from .. import stragglers, timeline
from ..files import write_json_atomically
from ..tracking.names import PHASES, SPLIT
from .records import EPOCH, EVALUATIONS, STALL, STEP, SUMMARY, Context, Metrics


def mean_over_ranks(per_rank: list[dict], key: str) -> float:
    return statistics.fmean(record[key] for record in per_rank)


@dataclass(frozen=True)
class Ending:
    """What the job's end adds: each rank's mean times over all steps and after the first `timing_warmup_steps`
    (warm-up iterations are not timed), each rank's time in its step recorder (the split's and the timeline's own
    cost) and the final weights' hash (equal hashes: equal weights, bit for bit)."""

    per_rank_means: list[dict]
    wall_time_s: float
    per_rank_steady: list[dict] | None = None
    timing_warmup_steps: int = 0
    recorder_busy_s: list[float] | None = None
    weights_sha256: str | None = None

    @property
    def steady_per_rank(self) -> list[dict]:
        return self.per_rank_steady or self.per_rank_means

    @property
    def overall(self) -> dict:
        return {key: mean_over_ranks(self.per_rank_means, key) for key in PHASES}

    @property
    def steady(self) -> dict:
        return {key: mean_over_ranks(self.steady_per_rank, key) for key in PHASES}


class SummaryFile:
    """Keeps each step, epoch, evaluation and stall; writes the summary it is logged (to `path`, if one is named)."""

    def __init__(self, context: Context, path: str | None):
        self.context, self.path = context, path
        self.steps: list[dict] = []
        self.epochs: list[dict] = []
        self.evaluations: list[dict] = []  # every test evaluation with the time and bytes it took to get there
        self.stalls: list[dict] = []  # hosts that went silent and came back (liveness.Stall)
        self.split_steps: list[list[dict]] = []  # each rank's split steps (timeline.split)
        self.held: dict = {}  # memory per rank, measured (memory.py) beside the model's (netmodel/memory.py)
        self.timeline: dict = {}  # the recorded window's per-message figures beside the model's
        self.recompiled: int | None = None  # under --compile: graphs compiled once training began
        self.unwritten: str | None = None  # why the file could not be written at the end (a disk that filled)

    def log(self, metrics: Metrics, step: int) -> None:
        if metrics.kind == STEP:
            self.steps.append(metrics.values)
            if metrics.splits:
                kept = self.split_steps or [[] for _ in metrics.splits]
                self.split_steps = [before + steps for before, steps in zip(kept, metrics.splits)]
        elif metrics.kind == EPOCH:
            self.epochs.append(metrics.values)
        elif metrics.kind in EVALUATIONS:
            self.evaluations.append(metrics.values)
        elif metrics.kind == STALL:
            self.stalls.append(metrics.values)
        elif metrics.kind == SUMMARY and self.path:
            try:
                write_json_atomically(self.path, metrics.values)
            except OSError as error:  # the other outputs still take the summary; the job's exit tells (train.py)
                self.unwritten = f"the summary (--summary-json {self.path}: {error.strerror or error})"

    def close(self) -> None: ...

    def build(self, job: dict, ending: Ending) -> dict:
        """The whole job's summary, its parts in the order its readers know; a part a job lacks adds no key."""
        steady = ending.steady
        summary: dict = {"config": self.context.config, **job, "samples_per_step": self.context.samples_per_step}
        for part in (self.rows(), self.times(ending, steady), self.speed(job, steady), self.weights(ending),
                     self.health(), self.split(), self.recorded(ending), self.modelled(steady), self.compiled()):
            summary.update(part)
        summary.update(wall_time_s=ending.wall_time_s, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        return summary

    def rows(self) -> dict:
        return {"steps": self.steps, "epochs": self.epochs, "evaluations": self.evaluations}

    def times(self, ending: Ending, steady: dict) -> dict:
        return {"per_rank_mean_times": ending.per_rank_means,
                "per_rank_mean_times_after_warmup": ending.steady_per_rank,
                "mean_times": ending.overall, "timing_warmup_steps": ending.timing_warmup_steps,
                "mean_times_after_warmup": steady, "final_loss": self.steps[-1]["loss"] if self.steps else None}

    def speed(self, job: dict, steady: dict) -> dict:
        throughput = self.context.throughput
        if not throughput:
            return {}
        return {"throughput": {**throughput.as_dict(), **self.context.speed(steady, job.get("world_size", 1))}}

    def weights(self, ending: Ending) -> dict:
        return {"weights_sha256": ending.weights_sha256} if ending.weights_sha256 else {}

    def health(self) -> dict:
        """Memory held per rank, then the hosts that went silent (always listed, if none)."""
        return {**({"memory": self.held} if self.held else {}), "network_stalls": self.stalls}

    def split(self) -> dict:
        """The wait for the last rank apart from transfer, over the steps after the warm-up."""
        if not self.split_steps:
            return {}
        after = [[s for s in steps if s["step"] > self.context.steady_from] for steps in self.split_steps]
        chosen = after if after[0] else self.split_steps  # a job too short to leave any out: all its steps
        per_rank = [timeline.means(steps) for steps in chosen]
        mean = {key: statistics.fmean(rank[key] for rank in per_rank) for key in SPLIT}
        return {"sync_split_after_warmup": {"mean": mean, "per_rank": per_rank,
                                            "slowest_rank": timeline.slowest(chosen)}}

    def recorded(self, ending: Ending) -> dict:
        """The step recorder's cost, the timeline's messages, and each rank's clock against rank 0's."""
        return {**({"recorder_busy_s": ending.recorder_busy_s} if ending.recorder_busy_s else {}),
                **({"timeline": self.timeline} if self.timeline else {}),
                "clock_alignment": [{"rank": rank, "offset_s": a.offset_s, "error_s": a.error_s}
                                    for rank, a in enumerate(self.context.alignments)]}

    def modelled(self, steady: dict) -> dict:
        """The alpha-beta model's sync time for the measured compute, and a slow host's price, where modelled."""
        model = self.context.sync_model
        if not model:
            return {}
        predicted = {"predicted_sync_time_s": model.sync_time(steady["compute_time_s"]),
                     "prediction_fit_error": model.fit_error}
        if model.straggler:
            predicted["slow_host"] = stragglers.priced(model, steady["compute_time_s"])
        return predicted

    def compiled(self) -> dict:
        return {} if self.recompiled is None else {"graphs_compiled_after_setup": self.recompiled}
