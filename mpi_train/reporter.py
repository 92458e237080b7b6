"""Every rank-0 side effect of a training job in one place: console lines, the summary file, the tracker.

Collectives happen on every rank in the training loop; the gathered values are then
handed to the reporter. On rank 0 it is a real `Reporter`; on the other ranks it is a
`SilentReporter` whose methods do nothing, so the loop never asks "am I rank 0?".
"""

from __future__ import annotations

import statistics
import time

from .config import JobInfo
from .files import write_json_atomically
from .tracking import NullTracker
from .tracking.names import PHASES


def mean_over_ranks(per_rank: list[dict], key: str) -> float:
    return statistics.fmean(record[key] for record in per_rank)


class SilentReporter:
    """What ranks other than 0 report: nothing."""

    def start(self, job: JobInfo) -> None: ...
    def log_step(self, epoch: int, step: int, total_steps: int, per_rank: list[dict],
                 lr: float | None = None) -> None: ...
    def log_epoch(self, epoch: int, step: int, test_loss: float, test_accuracy: float,
                  epoch_time_s: float) -> None: ...
    def finish(self, per_rank_means: list[dict], wall_time_s: float, per_rank_steady: list[dict] | None = None,
               timing_warmup_steps: int = 0) -> None: ...
    def save_weights(self, model) -> None: ...
    def note_stall(self, stall) -> None: ...


class Reporter(SilentReporter):
    """Rank 0: prints progress, collects the summary written at the end, and forwards both to the tracker."""

    def __init__(self, config_dict: dict, global_batch: int, summary_path: str | None, print_fn=print,
                 tracker: NullTracker | None = None, sync_model=None):
        self.config = config_dict
        self.global_batch = global_batch
        self.summary_path = summary_path
        self.tracker = tracker or NullTracker()
        self.sync_model = sync_model  # the alpha-beta model's view of this job (netmodel.JobModel), None on one host
        self._print = print_fn
        self.job: dict = {}  # the JobInfo's fields, as the summary carries them
        self.steps: list[dict] = []
        self.epochs: list[dict] = []
        self.stalls: list[dict] = []  # hosts that went silent and came back (liveness.Stall)

    def print(self, line: str) -> None:
        """Console output, also kept by the tracker as the run's console log."""
        self._print(line)
        self.tracker.console(line)

    def start(self, job: JobInfo) -> None:
        self.job = job.as_dict()
        hosts = sorted(set(job.hosts))
        self.print(
            f"mpi_train: {job.world_size} rank(s) on {len(hosts)} host(s) ({', '.join(hosts)}), "
            f"backend {job.backend}, sync {self.config['sync']}, {self.config['model']} on "
            f"{self.config['dataset']}, batch {self.global_batch} ({job.batch_size_per_rank} per rank), "
            f"{job.threads} thread(s) per rank, {job.total_steps} steps, rendezvous {job.rendezvous}"
        )
        where = self.tracker.where()
        if where:
            self.print(f"mpi_train: {where}")
        model = self.sync_model
        if model and model.host_links:
            self.print("mpi_train: host links measured: " + ", ".join(
                f"{host} {rate / 1e6:,.1f} MB/s" for host, rate in model.host_links.items()))
        if model and model.straggler:
            cost = model.straggler_cost(0.0)  # no compute measured yet: as if nothing hid behind backward
            self.tracker.log_straggler(model.straggler)
            self.print(f"mpi_train: slow host: {model.straggler.describe()}; every rank waits for it, about "
                       f"+{cost:.3f} s of sync per step by the model")

    def log_step(self, epoch: int, step: int, total_steps: int, per_rank: list[dict], lr: float | None = None) -> None:
        loss = mean_over_ranks(per_rank, "loss")
        times = {key: mean_over_ranks(per_rank, key) for key in PHASES}
        if self.sync_model:
            times["predicted_sync_time_s"] = self.sync_model.sync_time(times["compute_time_s"])
        self.steps.append({"step": step, "epoch": epoch, "loss": loss, **({"lr": lr} if lr is not None else {}),
                           **times})
        self.tracker.log_step(epoch, step, loss, times, self.global_batch / times["step_time_s"], per_rank, lr=lr)
        self.print(
            f"epoch {epoch} step {step:>5}/{total_steps}  loss {loss:.4f}  "
            + (f"lr {lr:.4g}  " if lr is not None else "")
            + f"step {times['step_time_s']:.3f}s "
            f"(compute {times['compute_time_s']:.3f}s, sync {times['sync_time_s']:.3f}s)  "
            f"{self.global_batch / times['step_time_s']:.0f} samples/s"
        )

    def note_stall(self, stall) -> None:
        """A host that went silent and came back; called from the heartbeat watch's thread."""
        self.stalls.append({"host": stall.host, "ranks": list(stall.ranks), "step": stall.step,
                            "seconds": stall.seconds})
        self.tracker.log_stall(stall)
        self.print(f"mpi_train: network stall: {stall.describe()}; it answers again and the job goes on.")

    def slow_host(self, means: dict) -> dict:
        """The straggler and what it cost each step, by the model given the measured compute; printed too."""
        model = self.sync_model
        cost = model.straggler_cost(means["compute_time_s"])
        without = model.sync_time(means["compute_time_s"], model.network.without_slow())
        self.print(f"mpi_train: slow host {model.straggler.host} cost about {cost:.3f} s per step (model: sync "
                   f"{without + cost:.3f} s with its link, {without:.3f} s without; "
                   f"measured sync {means['sync_time_s']:.3f} s)")
        return {**model.straggler.as_dict(), "cost_s": cost, "predicted_sync_without_s": without}

    def log_epoch(self, epoch: int, step: int, test_loss: float, test_accuracy: float, epoch_time_s: float) -> None:
        self.epochs.append({"epoch": epoch, "test_loss": test_loss, "test_accuracy": test_accuracy,
                            "epoch_time_s": epoch_time_s})
        self.tracker.log_epoch(epoch, step, test_loss, test_accuracy, epoch_time_s)
        self.print(f"epoch {epoch} test loss {test_loss:.4f}  accuracy {100 * test_accuracy:.2f}%  "
                   f"({epoch_time_s:.1f}s)")

    def finish(self, per_rank_means: list[dict], wall_time_s: float, per_rank_steady: list[dict] | None = None,
               timing_warmup_steps: int = 0) -> None:
        """The whole-job summary; `per_rank_steady` are the means leaving out the first `timing_warmup_steps`
        (the seed assignment's convention: warm-up iterations are not timed)."""
        overall = {key: mean_over_ranks(per_rank_means, key) for key in PHASES}
        steady = {key: mean_over_ranks(per_rank_steady or per_rank_means, key) for key in PHASES}
        self.print(
            f"done in {wall_time_s:.1f}s: mean step {steady['step_time_s']:.3f}s leaving out the first "
            f"{timing_warmup_steps} step(s) ({overall['step_time_s']:.3f}s over all), sync "
            f"{steady['sync_time_s']:.3f}s ({100 * steady['sync_time_s'] / steady['step_time_s']:.1f}% of step)"
        )
        summary = {
            "config": self.config,
            **self.job,
            "steps": self.steps,
            "epochs": self.epochs,
            "per_rank_mean_times": per_rank_means,
            "per_rank_mean_times_after_warmup": per_rank_steady or per_rank_means,
            "mean_times": overall,
            "timing_warmup_steps": timing_warmup_steps,
            "mean_times_after_warmup": steady,
            "final_loss": self.steps[-1]["loss"] if self.steps else None,
            "network_stalls": self.stalls,
            **({"predicted_sync_time_s": self.sync_model.sync_time(steady["compute_time_s"])}
               if self.sync_model else {}),
            **({"slow_host": self.slow_host(steady)} if self.sync_model and self.sync_model.straggler else {}),
            "wall_time_s": wall_time_s,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if self.summary_path:
            write_json_atomically(self.summary_path, summary)
        self.tracker.finish(summary)

    def save_weights(self, model) -> None:
        self.tracker.save_weights(model)
