"""The end of a sweep: its finished jobs compared, the bench's cost table, and the lab's model check; printed,
written to OUT/report.txt and, with tracking, stored as an MLflow run."""

from __future__ import annotations

import json

from ..analysis import model_accuracy
from ..analysis.compare import comparison, log_comparison, prediction_rows
from ..analysis.compare_plots import plot, plot_predictions, plot_sync_costs, prediction_points
from ..analysis.finished_jobs import job_from_summary, load_jobs
from ..benchmark.bench_report import describe
from ..config import redact_uri
from ..tracking import mlflow_client
from ..tracking.links import share_views, where
from .experiment_file import Sweep
from .sweep_launch import Launch
from .sweep_plan import bench_json


def collect_jobs(sweep: Sweep, uri: str | None, launches: list[Launch], since_ms: int):
    """This sweep's finished jobs: from MLflow when tracked, else from their summary files. Returns (jobs, client,
    experiment id)."""
    finished = {l.name for l in launches if l.returncode == 0 and not l.name.startswith("bench-")}
    if uri:
        client = mlflow_client(uri)
        experiment = client.get_experiment_by_name(sweep.name)
        if experiment is None:
            return [], client, None
        return (load_jobs(client, experiment.experiment_id, since_ms=since_ms, names=finished), client,
                experiment.experiment_id)
    jobs = []
    for name in sorted(finished):
        summary = sweep.out / "runs" / f"{name}.json"
        if summary.is_file():
            jobs.append(job_from_summary(name, json.loads(summary.read_text())))
    return sorted(jobs, key=lambda j: (j.sync, j.world_size, j.name)), None, None


def report(sweep: Sweep, uri: str | None, launches: list[Launch], since_ms: int) -> None:
    """compare.py's table and plots for the sweep's jobs, and the bench's cost table and plot; printed and stored."""
    jobs, client, experiment_id = collect_jobs(sweep, uri, launches, since_ms)
    sections, paths = [], []
    if jobs:
        sections.append(comparison(jobs, f"Runs of {sweep.name!r}", sweep.target_accuracy, sweep.target_loss))
        paths += plot(jobs, sweep.out / "plots", sweep.target_accuracy, sweep.target_loss)
        predictions = prediction_rows(jobs)
        if prediction_points(predictions):
            paths.append(plot_predictions(predictions, sweep.out / "plots"))
    elif sweep.runs:
        sections.append(f"Runs of {sweep.name!r}: none finished, nothing to compare.")
    settings = sweep.network.settings if sweep.network else (None,)
    benches, bench_of = [], {}
    for setting in settings:
        path = bench_json(sweep, setting)
        bench_ran = any(l.name.startswith("bench-") and l.network == setting and l.returncode == 0 for l in launches)
        if bench_ran and path.is_file():
            result = json.loads(path.read_text())
            benches.append(result)
            bench_of[setting] = result
            sections.append(describe(result))
            paths.append(plot_sync_costs(result, sweep.out / "plots",
                                         name=path.stem.replace("bench", "sync_cost_vs_floor") + ".png"))
    written = {launch.name: sweep.out / "runs" / f"{launch.name}.json" for launch in launches if launch.returncode == 0}
    summaries = {name: json.loads(path.read_text()) for name, path in written.items() if path.is_file()}
    messages = model_accuracy.timeline_report(summaries)
    if messages:
        sections.append(messages)
    exposed = model_accuracy.exposed_report([(l.name, summaries[l.name], bench_of[l.network]) for l in launches
                                             if l.name in summaries and l.network in bench_of])
    if exposed:
        sections.append(exposed)
    if sweep.network and benches:  # the lab: every setting's bench against the model, in one table and two plots
        lab = model_accuracy.report(benches)
        if lab:
            sections.append(lab)
            paths += model_accuracy.plot(benches, sweep.out / "plots")
    text = "\n\n".join(sections)
    print("\n" + text)
    if paths:
        print("plots: " + ", ".join(str(p) for p in paths))
    (sweep.out / "report.txt").write_text(text + "\n" + "".join(f"plot: {p}\n" for p in paths))
    print(f"report: {sweep.out / 'report.txt'}")
    if client is not None and experiment_id is not None and jobs:
        run_id = log_comparison(client, experiment_id, jobs, text, paths, run_name=f"report-{sweep.name}")
        print(f"stored as MLflow run {run_id} in experiment {sweep.name!r} ({redact_uri(uri)})")
    if client is not None and experiment_id is not None:
        share_views(client, experiment_id)
        print(f"MLflow {where(uri, experiment_id, charts=True)}")
