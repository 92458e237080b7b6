"""`python -m mpi_train compare`: the finished jobs of an experiment side by side, as a table and as plots.

Reads parent and child runs through the MLflow client (the same keys in every job make
this, and the UI's compare view, work), prints one row per job and writes PNGs:
loss against step per job, the mean step split into its phases, and each rank's
step-time spread. With --log-artifacts the plots and table become a comparison run.
Every time is the job's `summary/` figure (tracking/names.py), taken once by one rule
(SUMMARY_RULE: means over ranks and over the steps after the timing warm-up) and shown the
same in every table; beside it, memory per rank (`memory/total_bytes`: parameters, gradients and
optimizer state, the most any rank held), what a sharded method saves for its time. Jobs of
earlier versions are read under the names they logged (and show no memory).

Every column has one format and says its unit and, for a ratio, what it is against. Two
figures that differ by less than the machine's noise (NOISE_RULE) get no verdict: a
speed-up or a model's error of a few milliseconds on a shared CPU says nothing. A plot
whose model fitted its own calibration worse than FIT_ERROR_ROUGH says so in its title.

    python -m mpi_train compare --experiment mpi_train --tracking-uri http://127.0.0.1:5000 --out plots
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ENV_DEFAULTS, redact_uri
from ..errors import UserError, format_error
from ..models import BUILT_IN, TOKENS
from ..stragglers import Straggler
from ..sync import BASELINE, GRADIENTS, SYNC_METHODS, label, split_label
from ..tracking import check_uri, default_store_uri, job_metrics, mlflow_client, probe_server
from ..tracking import names as metric_names
from . import time_to_accuracy
from .time_to_accuracy import Evaluation, Target

PLOTTED_PHASES = ("data_time_s", "compute_time_s", "sync_time_s", "optimizer_time_s")
# The runs table: each column's header says its unit, each has one format. SPEED_UP's header names its reference.
COLUMNS = ("run", "sync", "np", "step_ms", "sync_ms", "sync_%_of_step", "mem_MiB/rank", "samples/s", "final_loss",
           "test_acc_%", "speed-up")
FORMATS = {"step_ms": "{:.1f}", "sync_ms": "{:.1f}", "sync_%_of_step": "{:.1f}", "mem_MiB/rank": "{:.1f}",
           "samples/s": "{:.1f}", "final_loss": "{:.4f}", "test_acc_%": "{:.2f}", "speed-up": "{:.2f}x"}
SPEED_UP = "speed-up"
WITHIN_NOISE = "within-noise"  # in place of a verdict (a speed-up, a model's error) that the noise decides

# The noise rule: below NOISE_FLOOR_S a difference is the per-call overhead of Python and the backend on a shared CPU,
# which the model does not price; a run's own step times stray by its spread, and a difference inside NOISE_SPREADS
# spreads of either figure's run is the machine's, not the method's.
NOISE_FLOOR_S = 0.005
NOISE_SPREADS = 2
NOISE_RULE = (f"within noise = two figures that differ by less than max({1000 * NOISE_FLOOR_S:.0f} ms, "
              f"{NOISE_SPREADS} x the step-time spread of the runs they come from) get no verdict; spread = the "
              f"standard deviation of a run's logged step times after its timing warm-up (none for a run with fewer "
              f"than two: the {1000 * NOISE_FLOOR_S:.0f} ms alone), a bench's of a method's step minus the no-sync "
              f"step; under {1000 * NOISE_FLOOR_S:.0f} ms a difference is the per-call overhead the model does not "
              f"price")
FIT_ERROR_ROUGH = 0.20  # a fit off its own calibration points by more than the lab's ±20% target cannot meet it


@dataclass
class FinishedJob:
    """One finished job as the comparison sees it."""

    run_id: str
    name: str
    sync: str
    world_size: int
    metrics: dict
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    rank_step_times: list[list[float]] = field(default_factory=list)  # per rank, every logged window
    params: dict = field(default_factory=dict)  # the parent run's params (link, num_hosts, ranks_per_host, ...)
    slow_host: str | None = None  # a straggler host found at its start (stragglers.Straggler.describe)
    evaluations: list[Evaluation] = field(default_factory=list)  # each test evaluation, for time to accuracy
    drift_curve: list[tuple[int, float]] = field(default_factory=list)  # local SGD, DiLoCo: ranks from their average
    step_times: list[float] = field(default_factory=list)  # logged step times after the warm-up (steady_step_times)

    @property
    def label(self) -> str:
        return f"{self.sync} np{self.world_size}"

    @property
    def step_spread_s(self) -> float | None:
        """How far its step time strays on this machine: the standard deviation of its steady logged step times."""
        return spread(self.step_times)


def steady_step_times(windows: Sequence[tuple[int, float]], warmup_steps: int) -> list[float]:
    """A job's logged step times, (step, seconds) per window (each a mean over ranks), of the windows that start
    after the timing warm-up: a window holding a warm-up step is slower by its start-up, not by the machine's noise."""
    windows = sorted(windows)
    starts = [0, *(step for step, _ in windows[:-1])]  # a window starts after the step logged before it
    return [seconds for (_, seconds), before in zip(windows, starts) if before >= warmup_steps]


def spread(values: Sequence[float]) -> float | None:
    """The standard deviation of a figure over steps; None below two."""
    return statistics.stdev(values) if len(values) >= 2 else None


def noise_bound(*spreads: float | None) -> float:
    """The smallest difference NOISE_RULE gives a verdict on, for figures from runs of these spreads."""
    return max([NOISE_FLOOR_S] + [NOISE_SPREADS * s for s in spreads if s is not None and math.isfinite(s)])


def within_noise(figure: float, reference: float, *spreads: float | None) -> bool:
    """Whether two figures differ by less than the noise of the runs they come from (NOISE_RULE): no verdict."""
    return abs(figure - reference) < noise_bound(*spreads)


def fit_note(fit_error: float | None, what: str = "model", figures: str = "predictions") -> str | None:
    """What a plot of a model's `figures` says on its face when the calibration fit of its `what` is rough or
    unknown; None when the fit is within FIT_ERROR_ROUGH."""
    if fit_error is None:
        return f"{what} fit error not recorded: {figures} unchecked"
    if fit_error > FIT_ERROR_ROUGH:
        return f"{what} fit error {100 * fit_error:.0f}% (over {100 * FIT_ERROR_ROUGH:.0f}%): {figures} are rough"
    return None


def load_jobs(client, experiment_id: str, since_ms: int | None = None, names: set | None = None) -> list[FinishedJob]:
    """Every FINISHED job (parent run) of the experiment with its loss curve and its ranks' step times.

    `since_ms` and `names` narrow it to the jobs of one sweep (started after it began, with its run names).
    """
    where = "tags.`mpi_train.role` = 'job' and attributes.status = 'FINISHED'"
    if since_ms is not None:
        where += f" and attributes.start_time >= {int(since_ms)}"
    parents = client.search_runs([experiment_id], filter_string=where, order_by=["attributes.start_time ASC"],
                                 max_results=1000)
    jobs = []
    for run in parents:
        if names is not None and run.info.run_name not in names:
            continue
        params, metrics = run.data.params, run.data.metrics
        # bucketed+powersgd apart from bucketed
        sync = label(params.get("sync", "?"), params.get("compression", "none"))
        job = FinishedJob(run.info.run_id, run.info.run_name, sync, int(params.get("world_size", 0)), metrics,
                          params=dict(params), slow_host=run.data.tags.get("mpi_train.slow_host_link"))
        job.loss_curve = [(m.step, m.value) for m in sorted(history(client, job.run_id, metric_names.LOSS),
                                                           key=lambda m: m.step)]
        children = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{job.run_id}'",
                                      max_results=1000)
        job.evaluations = evaluations(client, job.run_id)
        job.drift_curve = [(m.step, m.value) for m in sorted(history(client, job.run_id, metric_names.DRIFT),
                                                             key=lambda m: m.step)]
        job.step_times = steady_step_times(
            [(m.step, m.value) for m in history(client, job.run_id, metric_names.step_key("step_time_s"))],
            int(params.get("timing_warmup_steps", 1)))
        for child in sorted(children, key=lambda c: int(c.data.tags.get("rank", 0))):
            steps = history(client, child.info.run_id, metric_names.rank_key("step_time_s"))
            job.rank_step_times.append([m.value for m in steps])
        jobs.append(job)
    return sorted(jobs, key=lambda j: (j.sync, j.world_size, j.name))


def history(client, run_id: str, key: str) -> list:
    """A metric's history under its name today, else under the name earlier versions logged it as."""
    found = client.get_metric_history(run_id, key)
    old = metric_names.OLD_NAMES.get(key)
    return found if found or old is None else client.get_metric_history(run_id, old)


def evaluations(client, run_id: str) -> list[Evaluation]:
    """A run's test evaluations with the training time and bytes logged at the same steps (jobs before these were
    logged: accuracy alone)."""
    at = {key: {m.step: m.value for m in history(client, run_id, key)}
          for key in (metric_names.TEST_ACCURACY, metric_names.ELAPSED, metric_names.SENT_MB, metric_names.TEST_LOSS)}
    return [Evaluation(step, accuracy, at[metric_names.ELAPSED].get(step), at[metric_names.SENT_MB].get(step),
                       at[metric_names.TEST_LOSS].get(step))
            for step, accuracy in sorted(at[metric_names.TEST_ACCURACY].items())]


def job_from_summary(name: str, summary: dict) -> FinishedJob:
    """A job read from its --summary-json file instead of MLflow (runs made with --no-tracking)."""
    metrics = job_metrics(summary, summary["config"]["batch_size"])
    sync = label(summary["config"]["sync"], summary["config"].get("compression", "none"))
    return FinishedJob(run_id="", name=name, sync=sync, world_size=summary["world_size"], metrics=metrics,
               loss_curve=[(step["step"], step["loss"]) for step in summary["steps"]],
               rank_step_times=[[rank["step_time_s"]] for rank in summary["per_rank_mean_times"]],
               params={"model": summary["config"].get("model"), "link": summary["config"].get("link"),
                       "num_hosts": summary.get("num_hosts"), "ranks_per_host": summary.get("ranks_per_host"),
                       **{key: str(summary["config"][key]) for key in ("period", "host_period", "powersgd_rank",
                                                                       "batch_size")
                          if summary["config"].get(key) is not None}},
               slow_host=Straggler.from_dict(summary["slow_host"]).describe() if summary.get("slow_host") else None,
               evaluations=[Evaluation(e["step"], e["test_accuracy"], e.get("elapsed_s"), e.get("sent_mb"),
                                       e.get("test_loss")) for e in summary.get("evaluations", [])],
               drift_curve=[(step["step"], step["drift"]) for step in summary["steps"] if "drift" in step],
               step_times=summary_step_times(summary))


def summary_step_times(summary: dict) -> list[float]:
    """steady_step_times of a job's --summary-json file."""
    return steady_step_times([(step["step"], step["step_time_s"]) for step in summary.get("steps", [])
                              if "step_time_s" in step], summary.get("timing_warmup_steps", 1))


def slow_host_lines(jobs: list[FinishedJob]) -> list[str]:
    """One line per job that ran with a straggler host: which, its link, and what it cost per step."""
    lines = []
    for job in jobs:
        if job.slow_host:
            cost = metric_names.read(job.metrics, metric_names.summary_key("slow_host_cost_s"))
            sync = timing(job.metrics, "sync_time_s")
            lines.append(f"  {job.name} ({job.label}): slow {job.slow_host}; it costs "
                         + (f"about {1000 * cost:.0f} ms per step by the model" if cost is not None
                            else "an unknown time per step")
                         + (f" (measured sync {1000 * sync:.0f} ms per step)" if sync is not None else ""))
    return lines


def timing(metrics: dict, phase: str) -> float | None:
    """A job's mean `phase` time per step by SUMMARY_RULE (older jobs: whole-run means, if that is all they have)."""
    return metric_names.read(metrics, metric_names.summary_key(phase))


def throughput(metrics: dict) -> float | None:
    return metric_names.read(metrics, metric_names.summary_key("samples_per_s"))


def speed_up_reference(jobs: list[FinishedJob]) -> FinishedJob | None:
    """The job every speed-up is against: the baseline method (ddp, as time to accuracy's) at its smallest world size
    (the first of its seeds), else the slowest job."""
    timed = [job for job in jobs if throughput(job.metrics)]
    baseline = [job for job in timed if job.sync == BASELINE]
    if baseline:
        return min(baseline, key=lambda job: (job.world_size, job.name))
    return min(timed, key=lambda job: throughput(job.metrics), default=None)


def speed_up_header(reference: FinishedJob | None) -> str:
    if reference is None:
        return SPEED_UP
    if reference.sync == BASELINE:
        return f"{SPEED_UP}_vs_{reference.sync}_np{reference.world_size}"
    return f"{SPEED_UP}_vs_slowest"


def table_rows(jobs: list[FinishedJob]) -> list[dict]:
    """One row per job, in the units the headers say (ms, %, MiB); speed-up is throughput against
    speed_up_reference's, WITHIN_NOISE where the two step times differ by less than the noise."""
    reference = speed_up_reference(jobs)
    rows = []
    for job in jobs:
        m = job.metrics
        step_s, sync_s = timing(m, "step_time_s"), timing(m, "sync_time_s")
        held = m.get(metric_names.memory_key("total_bytes"))
        accuracy = metric_names.read(m, metric_names.summary_key("test_accuracy")) or metric_names.read(
            m, metric_names.TEST_ACCURACY)
        speed_up = None
        if reference is not None and throughput(m) is not None:
            ref_step = timing(reference.metrics, "step_time_s")
            noisy = (job is not reference and step_s is not None and ref_step is not None
                     and within_noise(step_s, ref_step, job.step_spread_s, reference.step_spread_s))
            speed_up = WITHIN_NOISE if noisy else throughput(m) / throughput(reference.metrics)
        rows.append({
            "run": job.name, "sync": job.sync, "np": job.world_size,
            "step_ms": 1000 * step_s if step_s is not None else None,
            "sync_ms": 1000 * sync_s if sync_s is not None else None,
            "sync_%_of_step": 100 * sync_s / step_s if step_s and sync_s is not None else None,
            "mem_MiB/rank": held / 2**20 if held is not None else None,
            "samples/s": throughput(m),
            "final_loss": metric_names.read(m, metric_names.summary_key("final_loss")) or metric_names.read(
                m, metric_names.LOSS),
            "test_acc_%": 100 * accuracy if accuracy is not None else None,
            SPEED_UP: speed_up,
        })
    return rows


def format_table(rows: list[dict], speed_up: str = SPEED_UP) -> str:
    """The runs table: one format per column (FORMATS); `speed_up` is the speed-up column's header."""
    def cell(column: str, value) -> str:
        if value is None:
            return "-"
        if column in FORMATS and isinstance(value, (int, float)):
            return FORMATS[column].format(value)
        return str(value)

    headers = [speed_up if column == SPEED_UP else column for column in COLUMNS]
    cells = [headers] + [[cell(c, row[c]) for c in COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def runs_table(jobs: list[FinishedJob]) -> str:
    """The runs table with the notes that say what each column is measured against and the noise rule."""
    reference = speed_up_reference(jobs)
    header = speed_up_header(reference)
    against = ("" if reference is None else
               f"; {header} = samples/s over run {reference.name}'s ({BASELINE} at its smallest np, else the slowest "
               f"run), {WITHIN_NOISE} where the two step times differ by less than the noise")
    return (format_table(table_rows(jobs), header) + "\n"
            + "step_ms, sync_ms: means per step by the rule above; sync_%_of_step = sync_ms / step_ms; mem_MiB/rank: "
              "parameters, gradients and optimizer state, the most any rank held; samples/s: the job's, all ranks; "
              f"test_acc_%: the last test evaluation{against}.\n"
            + f"Noise: {NOISE_RULE}.")


def plot(jobs: list[FinishedJob], out: Path, target_accuracy: float | None = None,
         target_loss: float | None = None) -> list[Path]:
    """Three PNGs a person would rather look at than the table, and accuracy against time and bytes for runs that
    were evaluated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(8, 5))
    for job in jobs:
        steps, values = zip(*job.loss_curve) if job.loss_curve else ((), ())
        ax.plot(steps, values, marker="o", markersize=3, label=job.label)
    ax.set(xlabel="step", ylabel="training loss (mean over ranks)", title="Loss against step")
    ax.legend()
    ax.grid(alpha=0.3)
    written.append(save_figure(fig, out / "loss_vs_step.png"))

    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(jobs) + 2), 5))
    bottom = [0.0] * len(jobs)
    for phase in PLOTTED_PHASES:
        heights = [1000 * (timing(j.metrics, phase) or 0.0) for j in jobs]
        ax.bar([j.label for j in jobs], heights, bottom=bottom, label=phase.removesuffix("_time_s"))
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set(ylabel="mean time per step (ms)", title="Where a step's time goes")
    ax.legend()
    ax.tick_params(axis="x", rotation=20)
    written.append(save_figure(fig, out / "time_breakdown.png"))

    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(jobs) + 2), 5))
    data, labels, positions, position = [], [], [], 0
    for job in jobs:
        for rank, times in enumerate(job.rank_step_times):
            data.append([1000 * t for t in times] or [0.0])
            labels.append(f"{job.label}\nrank {rank}")
            positions.append(position)
            position += 1
        position += 1  # a gap between jobs
    if data:
        ax.boxplot(data, positions=positions)
        ax.set_xticks(positions, labels, fontsize=7, rotation=90)
    ax.set(ylabel="step time (ms), every logged window", title="Per-rank step-time spread")
    written.append(save_figure(fig, out / "rank_step_time_spread.png"))
    target = race_target(jobs, target_accuracy, target_loss)
    if target is not None:
        name = "accuracy_vs_time.png" if target.kind == time_to_accuracy.ACCURACY else "validation_loss_vs_time.png"
        written.append(time_to_accuracy.plot(accuracy_runs(jobs), target, out / name))
    drifting = [job for job in jobs if job.drift_curve]
    if drifting:
        fig, ax = plt.subplots(figsize=(8, 5))
        for job in drifting:
            steps, values = zip(*job.drift_curve)
            ax.plot(steps, values, marker="o", markersize=3, label=job.name)
        ax.set(xlabel="step", ylabel="L2 distance from the average (mean over ranks)", yscale="log",
               title="How far the ranks' models drift apart between averages")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        written.append(save_figure(fig, out / "drift_vs_step.png"))
    return written


PREDICTION_COLUMNS = ("sync", "model", "np", "hosts", "link", "measured_ms", "predicted_ms", "error", "fit_error")


def hidden_in_backward(sync: str) -> bool:
    """DDP and its hooked variants communicate inside backward: their sync time cannot be measured apart."""
    name = split_label(sync)[0]
    return name in SYNC_METHODS and SYNC_METHODS[name].inside_ddp()


def prediction_rows(jobs: list[FinishedJob]) -> list[dict]:
    """Predicted (mpi_train/netmodel/) against measured sync time per job, with the relative error (None where
    either is missing, the sync is inside backward, or the two are within the run's noise: `noisy`); measured is
    the same summary figure as in the runs table (SUMMARY_RULE). fit_error: how far the links the job predicted
    with missed their own calibration points (None for jobs that did not record it)."""
    rows = []
    for job in jobs:
        m = job.metrics
        predicted = metric_names.read(m, metric_names.summary_key("predicted_sync_s"))
        measured = timing(m, "sync_time_s")
        hidden = hidden_in_backward(job.sync)
        noisy = (not hidden and predicted is not None and measured is not None
                 and within_noise(predicted, measured, job.step_spread_s))
        rows.append({"sync": job.sync, "model": job.params.get("model"), "np": job.world_size,
                     "hosts": job.params.get("num_hosts"), "link": job.params.get("link") or "-",  # unset: not logged
                     "measured_s": measured, "predicted_s": predicted,
                     "error": (None if hidden or noisy or not predicted or not measured
                               else (predicted - measured) / measured),
                     "hidden": hidden, "noisy": noisy, "noise_s": noise_bound(job.step_spread_s),
                     "fit_error": metric_names.read(m, metric_names.summary_key("prediction_fit_error"))})
    return sorted(rows, key=lambda r: (str(r["model"]), str(r["link"]), int(r["hosts"] or 0), r["np"], r["sync"]))


def format_prediction_table(rows: list[dict]) -> str:
    def cell(row: dict, column: str) -> str:
        if column == "measured_ms":
            value = row["measured_s"]
            return "in compute" if row["hidden"] else ("-" if value is None else f"{1000 * value:.1f}")
        if column == "predicted_ms":
            return "-" if row["predicted_s"] is None else f"{1000 * row['predicted_s']:.1f}"
        if column == "error":
            if row["noisy"]:
                return WITHIN_NOISE
            return "n/a" if row["error"] is None else f"{100 * row['error']:+.0f}%"
        if column == "fit_error":
            return "-" if row["fit_error"] is None else f"{100 * row['fit_error']:.0f}%"
        return "-" if row[column] is None else str(row[column])

    cells = [list(PREDICTION_COLUMNS)] + [[cell(row, c) for c in PREDICTION_COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(PREDICTION_COLUMNS))]
    lines = ["  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def worst_fit(rows: list[dict]) -> float | None:
    """The worst calibration fit behind the rows' predictions; None when any of them did not record its fit."""
    errors = [row["fit_error"] for row in rows]
    return None if not errors or None in errors else max(errors)


def predictions_figure(rows: list[dict]):
    """Measured against predicted sync time, one marker per method (hollow: within the run's noise, no verdict); on
    the diagonal the model is exact. Its title says when the model's fit is rough (fit_note)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in rows if r["predicted_s"] and r["measured_s"] and not r["hidden"]]
    fig, ax = plt.subplots(figsize=(7, 6))
    methods = sorted({r["sync"] for r in points})
    for index, sync in enumerate(methods):
        colour = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")(index % 20)
        mine = [r for r in points if r["sync"] == sync]
        for noisy in (False, True):
            shown = [r for r in mine if r["noisy"] == noisy]
            if shown:
                ax.scatter([1000 * r["predicted_s"] for r in shown], [1000 * r["measured_s"] for r in shown], s=40,
                           label=None if noisy and len(shown) < len(mine) else sync, edgecolors=colour,
                           facecolors="none" if noisy else colour)
    if points:
        low = min(min(r["predicted_s"], r["measured_s"]) for r in points) * 1000 / 1.5
        high = max(max(r["predicted_s"], r["measured_s"]) for r in points) * 1000 * 1.5
        ax.plot([low, high], [low, high], color="black", linewidth=1, label="measured = predicted")
        ax.fill_between([low, high], [low * 0.8, high * 0.8], [low * 1.2, high * 1.2], color="grey", alpha=0.2,
                        label="±20%")
        ax.set(xscale="log", yscale="log")
    if any(r["noisy"] for r in points):
        ax.scatter([], [], s=40, facecolors="none", edgecolors="grey", label="hollow: within noise")
    note = fit_note(worst_fit(points))
    title = "Sync time: model against measurement"
    ax.set_title(title + (f"\n{note}" if note else ""), color="firebrick" if note else "black")
    ax.set(xlabel="predicted sync time per step (ms, alpha-beta model)", ylabel="measured sync time per step (ms)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig


def plot_predictions(rows: list[dict], out: Path) -> Path:
    """predictions_figure as predicted_vs_measured.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    return save_figure(predictions_figure(rows), out / "predicted_vs_measured.png")


def bench_fit_error(bench: dict) -> float | None:
    """How far the links a bench's floors and predictions stand on missed their calibration points: the link within
    a host, and between hosts when it spans them; None without a calibration."""
    network = (bench.get("calibration") or {}).get("network")
    if not network:
        return None
    crossed = ("intra", "inter") if (bench.get("layout") or {}).get("hosts", 1) > 1 else ("intra",)
    return max(network[link].get("fit_error", 0.0) for link in crossed)


def sync_costs_figure(bench: dict):
    """Each method's measured communication time beside the floor its cost model allows, one row per method (a bench
    has dozens); the title says when the calibration behind the floor fitted badly (fit_note)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in bench["methods"] if row.get("collective")]
    fig, ax = plt.subplots(figsize=(9, max(4.0, 0.32 * len(rows) + 2)))
    positions = list(range(len(rows)))
    ax.barh([p - 0.2 for p in positions], [1000 * row["sync_s"] for row in rows], height=0.4,
            label="sync (between barriers)")
    ax.barh([p + 0.2 for p in positions], [1000 * max(0.0, row["exposed_s"]) for row in rows], height=0.4,
            label="exposed (step minus no-sync step)")
    ax.scatter([1000 * row["floor_s"] for row in rows], positions, marker="|", s=250, color="black", zorder=3,
               label="cost-model floor")
    ax.set_yticks(positions, [f"{row['method']} ({row['collective']})" for row in rows], fontsize=8)
    ax.invert_yaxis()  # the bench's order, top to bottom
    note = fit_note(bench_fit_error(bench), "link", "floors") if bench.get("world_size", 1) > 1 else None
    ax.set_title(f"Sync cost against theory: {bench['model']}, np {bench['world_size']}, "
                 f"{bench['gradient_bytes'] / 1e6:.0f} MB of gradients" + (f"\n{note}" if note else ""),
                 color="firebrick" if note else "black")
    ax.set(xlabel="ms per step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    return fig


def plot_sync_costs(bench: dict, out: Path, name: str = "sync_cost_vs_floor.png") -> Path:
    """sync_costs_figure of a bench JSON (python -m mpi_train bench --json) under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    return save_figure(sync_costs_figure(bench), out / name)


def log_comparison(client, experiment_id: str, jobs: list[FinishedJob], text: str, paths: list[Path],
                   run_name: str | None = None) -> str:
    """Store the report's text and plots as a comparison run of the experiment; returns its id."""
    run = client.create_run(experiment_id, run_name=run_name or f"comparison-{len(jobs)}-jobs",
                            tags={"mpi_train.role": "comparison", "compared_runs": ",".join(j.run_id for j in jobs)})
    client.log_text(run.info.run_id, text + "\n", "comparison/table.txt")
    for path in paths:
        client.log_artifact(run.info.run_id, str(path), "comparison")
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def communication_table(jobs: list[FinishedJob]) -> str:
    """Jobs by their exposed communication, the wait for the last rank beside it; "" when no job measured it."""
    rows = []
    for job in jobs:
        figures = [metric_names.read(job.metrics, metric_names.summary_key(key)) for key in metric_names.SPLIT]
        if figures[0] is not None:
            rows.append((job, figures))
    if not rows:
        return ""
    name_width = max(28, *(len(job.name) + 2 for job, _ in rows))  # long run names keep their column apart
    header = (f"{'run':<{name_width}}{'sync':<22}{'np':>4}{'exposed_ms':>12}{'wait_ms':>10}{'transfer_ms':>13}"
              f"{'overlap':>9}")
    lines = [header]
    for job, (wait, transfer, exposed, overlap) in sorted(rows, key=lambda r: r[1][2]):
        lines.append(f"{job.name:<{name_width}}{job.sync:<22}{job.world_size:>4}{1000 * exposed:>12.1f}"
                     f"{1000 * wait:>10.1f}{1000 * transfer:>13.1f}{100 * overlap:>8.0f}%")
    return "\n".join(lines)


def accuracy_runs(jobs: list[FinishedJob]) -> list[tuple[str, str, list[Evaluation]]]:
    return [(job.name, job.sync, job.evaluations) for job in jobs if job.evaluations]


def configuration(job: FinishedJob) -> tuple:
    """What decides a run's steps to accuracy, whatever its link: every lossless method computes the same update (one
    key for all of them); another is its label with its averaging period, at its world size and global batch."""
    name, compression = split_label(job.sync)
    method = SYNC_METHODS.get(name)
    lossless = (method is not None and method.averages == GRADIENTS and compression == "none"
                and not method.fixed_compression)
    options = () if lossless else (job.sync, *(job.params.get(key) for key in ("period", "host_period",
                                                                              "powersgd_rank")))
    return ("lossless" if lossless else "", *options, job.world_size, job.params.get("batch_size"))


def carried_to_links(jobs: list[FinishedJob], target: float | Target) -> list[dict]:
    """Time to `target` on every link a configuration's runs were timed on (time_to_accuracy.carried); [] unless
    some run is carried to a link other than its evaluated run's."""
    evaluated = [(configuration(job), job.evaluations) for job in jobs if job.evaluations]
    timed = [(configuration(job), {"run": job.name, "sync": job.sync, "link": job.params.get("link") or "-",
                                   "step_s": timing(job.metrics, "step_time_s")}) for job in jobs]
    rows = time_to_accuracy.carried(evaluated, timed, target)
    reached_on = {job.params.get("link") or "-" for job in jobs
                  if job.evaluations and time_to_accuracy.reached(job.evaluations, target)}
    return rows if any(row["link"] not in reached_on for row in rows) else []


def language_models(jobs: list[FinishedJob]) -> bool:
    """Every job trained a language model (gpt): the race is to a validation loss, not an accuracy."""
    def takes_tokens(name: str | None) -> bool:
        return name in BUILT_IN and BUILT_IN[name].takes == TOKENS  # a user's own model takes images

    return bool(jobs) and all(takes_tokens(job.params.get("model")) for job in jobs)


def race_target(jobs: list[FinishedJob], target_accuracy: float | None = None,
                target_loss: float | None = None) -> Target | None:
    """What time to accuracy is measured to: the validation loss or accuracy given (not both), else for language
    models the best final validation loss plus 0.05 nats, for the others the best final accuracy minus 2 points;
    None when no run was evaluated."""
    if target_accuracy is not None and target_loss is not None:
        raise UserError(f"a comparison races to one target, and both a target accuracy ({target_accuracy}) and a "
                        f"target loss ({target_loss}) are given. Keep the accuracy for image models, the "
                        f"validation loss for language models.")
    if target_loss is not None:
        return Target(target_loss, time_to_accuracy.LOSS)
    if target_accuracy is not None:
        return Target(target_accuracy)
    kind = time_to_accuracy.LOSS if language_models(jobs) else time_to_accuracy.ACCURACY
    value = time_to_accuracy.default_target([c for _, _, c in accuracy_runs(jobs)], kind=kind)
    return Target(value, kind) if value is not None else None


def comparison(jobs: list[FinishedJob], title: str, target_accuracy: float | None = None,
               target_loss: float | None = None) -> str:
    """The comparison's text: its rule said once, the runs table, time to accuracy or to a validation loss (runs
    that were evaluated), predicted against measured sync (jobs on several hosts), the slow hosts."""
    sections = [f"{title} ({len(jobs)} finished). Times per step: {metric_names.SUMMARY_RULE}.\n"
                + runs_table(jobs)]
    target = race_target(jobs, target_accuracy, target_loss)
    if target is not None:
        sections.append(time_to_accuracy.describe(time_to_accuracy.rows(accuracy_runs(jobs), target),
                                                  given=target_accuracy is not None or target_loss is not None))
        carried = carried_to_links(jobs, target)
        if carried:
            sections.append(time_to_accuracy.describe_carried(carried, target))
    communication = communication_table(jobs)
    if communication:
        sections.append("Communication per step, least exposed first: exposed = what compute did not hide (for a "
                        "method that communicates during backward, from its last gradient to the end of its sync), "
                        "split into waiting for the last rank to arrive and transfer; overlap = the share of message "
                        "time that ran during backward:\n" + communication)
    predictions = prediction_rows(jobs)
    if any(row["predicted_s"] is not None for row in predictions):
        sections.append("Sync time per step, measured (the runs table's sync_ms) against the alpha-beta model "
                        "(mpi_train/netmodel/), per method and setting; error = (predicted - measured) / measured, "
                        f"{WITHIN_NOISE} by the noise rule above; fit_error = how far the links the run predicted "
                        f"with missed their own calibration points (over {100 * FIT_ERROR_ROUGH:.0f}%: the "
                        "predictions are rough):\n" + format_prediction_table(predictions))
    slow = slow_host_lines(jobs)
    if slow:
        sections.append("Slow hosts (every rank waits for the slowest link):\n" + "\n".join(slow))
    return "\n\n".join(sections)


def save_figure(fig, path: Path, rect: tuple | None = None) -> Path:
    """Lay the figure out (inside `rect`, leaving room for a legend or title outside the axes), write it, close it.
    Its titles go into the PNG's Title too, so what a plot says on its face can be read without looking."""
    fig.tight_layout(rect=rect)
    titles = [fig.get_suptitle(), *(ax.get_title() for ax in fig.axes if ax.get_visible())]
    fig.savefig(path, dpi=110, metadata={"Title": " | ".join(title for title in titles if title)})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mpi_train compare", description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", default="mpi_train",
                        help="experiment whose finished jobs are compared (default: mpi_train)")
    parser.add_argument("--tracking-uri", help="MLflow server or database (default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db)")
    parser.add_argument("--out", default="comparison", help="folder the PNG plots are written to (default: comparison)")
    parser.add_argument("--target-accuracy", type=float, metavar="FRACTION",
                        help="time to accuracy is measured to this test accuracy, e.g. 0.6 (default: the best run's "
                             "final accuracy minus 2 points; language models race to a validation loss instead)")
    parser.add_argument("--target-loss", type=float, metavar="NATS",
                        help="time to a validation loss: the first evaluation at or below this loss, e.g. 2.0 nats "
                             "per byte for gpt (default for language models: the best run's final validation loss "
                             "plus 0.05; not with --target-accuracy)")
    parser.add_argument("--log-artifacts", action="store_true",
                        help="also store the table and plots as a comparison run in the experiment")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import os

    args = build_parser().parse_args(argv)
    uri = args.tracking_uri or os.environ.get(ENV_DEFAULTS["tracking_uri"]) or default_store_uri()
    try:
        if check_uri(uri) in ("http", "https"):
            probe_server(uri)
        client = mlflow_client(uri)
        experiment = client.get_experiment_by_name(args.experiment)
        if experiment is None:
            raise UserError(f"Experiment {args.experiment!r} does not exist at {redact_uri(uri)}. Name one that "
                            f"training wrote to (--experiment of python -m mpi_train), or check --tracking-uri.")
        race_target([], args.target_accuracy, args.target_loss)  # one target at most, said before anything is read
        jobs = load_jobs(client, experiment.experiment_id)
        if not jobs:
            raise UserError(f"Experiment {args.experiment!r} at {redact_uri(uri)} has no FINISHED jobs to compare. "
                            f"Run some first: python -m mpi_train --experiment {args.experiment} ...")
    except UserError as error:
        print(format_error(str(error)), file=sys.stderr)
        return error.exit_code
    table = comparison(jobs, f"Jobs of {args.experiment!r}", args.target_accuracy, args.target_loss)
    print(table)
    predictions = prediction_rows(jobs)
    predicted = any(row["predicted_s"] is not None for row in predictions)
    paths = plot(jobs, Path(args.out), args.target_accuracy, args.target_loss)
    if predicted:
        paths.append(plot_predictions(predictions, Path(args.out)))
    print("plots: " + ", ".join(str(p) for p in paths))
    if args.log_artifacts:
        print(f"logged as run {log_comparison(client, experiment.experiment_id, jobs, table, paths)}")
    return 0
