"""The comparison's PNGs: loss, a step's time split, each rank's spread, accuracy or drift against time, predicted
against measured sync time, and a bench's sync costs against their floors."""

from __future__ import annotations

import collections
import re
from pathlib import Path

from ..files import write_figure
from . import time_to_accuracy
from .accuracy_race import accuracy_runs, race_target, workload_groups
from .finished_jobs import FinishedJob, timing
from .noise import fit_note

PLOTTED_PHASES = ("data_time_s", "compute_time_s", "sync_time_s", "optimizer_time_s")


# every PNG `plot` and `plot_predictions` may write: one a later comparison did not draw is removed from --out, so that
# the folder shows this comparison alone
PLOT_NAMES = ("loss_vs_step.png", "time_breakdown.png", "rank_step_time_spread.png", "accuracy_vs_time.png",
              "validation_loss_vs_time.png", "drift_vs_step.png", "predicted_vs_measured.png")


def remove_stale(out: Path, written: list[Path]) -> None:
    """Remove the plots of an earlier comparison in `out` that this one did not draw."""
    races = [path.name for pattern in ("accuracy_vs_time-*.png", "validation_loss_vs_time-*.png")
             for path in out.glob(pattern)]  # a comparison of several workloads draws a race for each
    for name in set(PLOT_NAMES + tuple(races)) - {path.name for path in written}:
        (out / name).unlink(missing_ok=True)


def shown_as(jobs: list[FinishedJob]) -> list[str]:
    """Each job's name in the plots: its method and ranks where no other job shares them, else its run name (told
    apart by finished_jobs.distinct_names): jobs of one label would share a legend entry, and a bar chart's one bar."""
    counts = collections.Counter(job.label for job in jobs)
    return [job.label if counts[job.label] == 1 else job.name for job in jobs]


def plot(jobs: list[FinishedJob], out: Path, target_accuracy: float | None = None,
         target_loss: float | None = None) -> list[Path]:
    """Three PNGs a person would rather look at than the table, and accuracy against time and bytes for runs that
    were evaluated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []

    shown = shown_as(jobs)
    fig, ax = plt.subplots(figsize=(8, 5))
    for job, name in zip(jobs, shown):
        steps, values = zip(*job.loss_curve) if job.loss_curve else ((), ())
        ax.plot(steps, values, marker="o", markersize=3, label=name)
    ax.set(xlabel="step", ylabel="training loss (mean over ranks)", title="Loss against step")
    ax.legend()
    ax.grid(alpha=0.3)
    written.append(write_figure(fig, out / "loss_vs_step.png"))

    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(jobs) + 2), 5))
    bottom = [0.0] * len(jobs)
    for phase in PLOTTED_PHASES:
        heights = [1000 * (timing(j.metrics, phase) or 0.0) for j in jobs]
        ax.bar(shown, heights, bottom=bottom, label=phase.removesuffix("_time_s"))
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set(ylabel="mean time per step (ms)", title="Where a step's time goes")
    ax.legend()
    ax.tick_params(axis="x", rotation=20)
    written.append(write_figure(fig, out / "time_breakdown.png"))

    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(jobs) + 2), 5))
    data, labels, positions, position = [], [], [], 0
    for job, name in zip(jobs, shown):
        for rank, times in enumerate(job.rank_step_times):
            data.append([1000 * t for t in times] or [0.0])
            labels.append(f"{name}\nrank {rank}")
            positions.append(position)
            position += 1
        position += 1  # a gap between jobs
    if data:
        ax.boxplot(data, positions=positions)
        ax.set_xticks(positions, labels, fontsize=7, rotation=90)
    ax.set(ylabel="step time (ms), every logged window", title="Per-rank step-time spread")
    written.append(write_figure(fig, out / "rank_step_time_spread.png"))
    groups = workload_groups(jobs)
    for workload, group in groups:
        target = race_target(group, target_accuracy, target_loss)
        if target is None:
            continue
        name = "accuracy_vs_time" if target.kind == time_to_accuracy.ACCURACY else "validation_loss_vs_time"
        if len(groups) > 1:  # one plot per workload, named by it
            name += "-" + re.sub(r"[^A-Za-z0-9_.]+", "_", workload)
        written.append(time_to_accuracy.plot(accuracy_runs(group), target, out / f"{name}.png"))
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
        written.append(write_figure(fig, out / "drift_vs_step.png"))
    return written


def worst_fit(rows: list[dict]) -> float | None:
    """The worst calibration fit behind the rows' predictions; None when any of them did not record its fit."""
    errors = [row["fit_error"] for row in rows]
    return None if not errors or None in errors else max(errors)


def prediction_points(rows: list[dict]) -> list[dict]:
    """The rows the predictions plot draws: a prediction and a measurement, neither hidden in compute (ddp's sync runs
    inside backward, so none of it is measured apart). Without any, there is no plot to draw."""
    return [r for r in rows if r["predicted_s"] and r["measured_s"] and not r["hidden"]]


def predictions_figure(rows: list[dict]):
    """Measured against predicted sync time, one marker per method (hollow: within the run's noise, no verdict); on
    the diagonal the model is exact. Its title says when the model's fit is rough (fit_note)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = prediction_points(rows)
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
    return write_figure(predictions_figure(rows), out / "predicted_vs_measured.png")


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
    return write_figure(sync_costs_figure(bench), out / name)
