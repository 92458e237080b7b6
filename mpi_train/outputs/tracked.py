"""The tracker (MLflow, tracking/) as an output: each record sent under the names tracking/names.py gives it."""

from __future__ import annotations

from ..liveness import Stall
from ..tracking import NullTracker
from .records import EPOCH, EVALUATIONS, STALL, STEP, SUMMARY, Metrics

ROW_KEYS = ("step", "epoch", "loss", "lr")  # a step's row around its times


class Tracked:
    """Forwards records to `tracker`; its runs are ended by the tracker's own context, not by close()."""

    def __init__(self, tracker: NullTracker, samples_per_step: int):
        self.tracker, self.samples_per_step = tracker, samples_per_step

    def log(self, metrics: Metrics, step: int) -> None:
        values = metrics.values
        if metrics.kind == STEP:
            times = {key: value for key, value in values.items() if key not in ROW_KEYS}
            self.tracker.log_step(values["epoch"], step, values["loss"], times,
                                  self.samples_per_step / times["step_time_s"], list(metrics.per_rank),
                                  lr=values.get("lr"))
        elif metrics.kind == EPOCH:
            self.tracker.log_epoch(values["epoch"], step, values["test_loss"], values["test_accuracy"],
                                   values["epoch_time_s"])
        elif metrics.kind in EVALUATIONS:
            self.tracker.log_eval(step, values["test_loss"], values["test_accuracy"], values["elapsed_s"],
                                  values["sent_mb"], values.get("perplexity"))
        elif metrics.kind == STALL:
            self.tracker.log_stall(Stall(values["host"], tuple(values["ranks"]), values["step"], values["seconds"]))
        elif metrics.kind == SUMMARY:
            self.tracker.finish(values)

    def close(self) -> None: ...
