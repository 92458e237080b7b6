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

Every column has one format and says its unit and, for a ratio, what it is against. This module holds the tables
and the command; the jobs are read in finished_jobs.py, judged against the noise in noise.py, raced to accuracy in
accuracy_race.py and drawn in compare_plots.py.

    python -m mpi_train compare --experiment mpi_train --tracking-uri http://127.0.0.1:5000 --out plots
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..config import redact_uri
from ..errors import ArgumentParser, UserError, format_error
from ..files import kept, unwritable
from ..outputs.text_table import clipped, text_table
from ..sync import BASELINE, SYNC_METHODS, split_label
from ..tracking import check_api, check_store_exists, check_uri, mlflow_client, probe_server, resolve_uri
from ..tracking import names as metric_names
from ..tracking.store import in_the_trash
from . import time_to_accuracy
from .accuracy_race import accuracy_runs, carried_to_links, race_target, workload_groups
from .compare_plots import plot, plot_predictions, prediction_points, remove_stale
from .finished_jobs import FinishedJob, load_jobs, throughput, timing
from .noise import FIT_ERROR_ROUGH, NOISE_RULE, WITHIN_NOISE, noise_bound, within_noise

# The runs table: each column's header says its unit, each has one format. SPEED_UP's header names its reference.
COLUMNS = ("run", "sync", "np", "step_ms", "sync_ms", "sync_%_of_step", "mem_MiB/rank", "samples/s", "final_loss",
           "test_acc_%", "speed-up")
FORMATS = {"step_ms": "{:.1f}", "sync_ms": "{:.1f}", "sync_%_of_step": "{:.1f}", "mem_MiB/rank": "{:.1f}",
           "samples/s": "{:.1f}", "final_loss": "{:.4f}", "test_acc_%": "{:.2f}", "speed-up": "{:.2f}x"}
SPEED_UP = "speed-up"
IN_COMPUTE = "in compute"  # ddp's sync, summed inside backward: none of it is timed apart


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
        hidden = hidden_in_backward(job.sync)  # its 0 ms of sync would read as communication that costs nothing
        rows.append({
            "run": job.name, "sync": job.sync, "np": job.world_size,
            "step_ms": 1000 * step_s if step_s is not None else None,
            "sync_ms": IN_COMPUTE if hidden else None if sync_s is None else 1000 * sync_s,
            "sync_%_of_step": IN_COMPUTE if hidden else None if not step_s or sync_s is None else 100 * sync_s / step_s,
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
    return text_table(cells)


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


PREDICTION_COLUMNS = ("sync", "model", "np", "hosts", "link", "measured_ms", "predicted_ms", "error", "fit_error")


def hidden_in_backward(sync: str) -> bool:
    """DDP and its hooked variants communicate inside backward: their sync time cannot be measured apart."""
    name = split_label(sync)[0]
    return name in SYNC_METHODS and SYNC_METHODS[name].traits.inside_ddp()


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
            return IN_COMPUTE if row["hidden"] else ("-" if value is None else f"{1000 * value:.1f}")
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
    return text_table(cells)


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
    name_width = max(28, *(len(clipped(job.name)) + 2 for job, _ in rows))  # long run names keep their column apart
    header = (f"{'run':<{name_width}}{'sync':<22}{'np':>4}{'exposed_ms':>12}{'wait_ms':>10}{'transfer_ms':>13}"
              f"{'overlap':>9}")
    lines = [header]
    for job, (wait, transfer, exposed, overlap) in sorted(rows, key=lambda r: r[1][2]):
        lines.append(f"{clipped(job.name):<{name_width}}{job.sync:<22}{job.world_size:>4}{1000 * exposed:>12.1f}"
                     f"{1000 * wait:>10.1f}{1000 * transfer:>13.1f}{100 * overlap:>8.0f}%")
    return "\n".join(lines)


def comparison(jobs: list[FinishedJob], title: str, target_accuracy: float | None = None,
               target_loss: float | None = None) -> str:
    """The comparison's text: its rule said once, the runs table, time to accuracy or to a validation loss (runs
    that were evaluated), predicted against measured sync (jobs on several hosts), the slow hosts."""
    sections = [f"{title} ({len(jobs)} finished). Times per step: {metric_names.SUMMARY_RULE}.\n"
                + runs_table(jobs)]
    mixed = mixed_workloads(jobs)
    if mixed:
        sections.insert(0, mixed)
    groups = workload_groups(jobs)
    for workload, group in groups:
        target = race_target(group, target_accuracy, target_loss)
        if target is None:
            continue
        race = time_to_accuracy.describe(time_to_accuracy.rows(accuracy_runs(group), target),
                                         given=target_accuracy is not None or target_loss is not None)
        sections.append(f"{workload}: {race}" if len(groups) > 1 else race)
        carried = carried_to_links(group, target)
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


def mixed_workloads(jobs: list[FinishedJob]) -> str | None:
    """A warning, when the jobs train more than one model or data set: their speed-ups and accuracies do not compare
    (every job lands in the experiment mpi_train unless told otherwise)."""
    workloads = collections.Counter(job.workload for job in jobs)
    if len(workloads) < 2:
        return None
    listed = ", ".join(f"{workload} ({count} job{'s' if count > 1 else ''})" for workload, count in workloads.items())
    return (f"warning: these jobs train {len(workloads)} workloads: {listed}. Their step times and speed-ups "
            f"compare within one workload only, and each workload races to its own target below; give each its own "
            f"--experiment when training.")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m mpi_train compare", description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", default="mpi_train",
                        help="experiment whose finished jobs are compared (default: mpi_train)")
    parser.add_argument("--tracking-uri",
                        help="MLflow server or database (default: $MLFLOW_TRACKING_URI, else "
                             "sqlite:///mlruns/mlflow.db)")
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


def job_statuses(client, experiment_id: str) -> collections.Counter:
    """How many of the experiment's jobs end in each status (RUNNING for those under way)."""
    runs = client.search_runs([experiment_id], filter_string="tags.`mpi_train.role` = 'job'", max_results=1000)
    return collections.Counter(run.info.status for run in runs)


def unfinished(client, experiment_id: str) -> str:
    """What jobs the experiment does hold, by status, as a clause: compare reads only the finished ones."""
    counts = job_statuses(client, experiment_id)
    if not counts:
        return ""
    held = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
    return f" (its jobs: {held}; compare reads the FINISHED ones, whose figures are whole)"


def named_experiment(client, name: str):
    """The experiment `name` names, or the one whose id it is (the number its link shows); None for neither."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None and name.isdigit():
        from mlflow.exceptions import MlflowException  # here, not at the top: importing mlflow takes a second

        with contextlib.suppress(MlflowException):
            experiment = client.get_experiment(name)
    return experiment


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out = os.path.expanduser(args.out)  # --out=~/plots, which the shell leaves as it is
    uri = resolve_uri(args.tracking_uri)
    try:
        if check_uri(uri) in ("http", "https"):
            probe_server(uri, otherwise="or name the store the jobs wrote to")
        check_store_exists(uri)
        client = mlflow_client(uri)
        check_api(client, uri, "Nothing was compared.")
        experiment = named_experiment(client, args.experiment)
        if experiment is None:
            raise UserError(f"Experiment {args.experiment!r} does not exist at {redact_uri(uri)}. Name one that "
                            f"training wrote to (--experiment of python -m mpi_train), or check --tracking-uri.")
        if experiment.lifecycle_stage == "deleted":
            raise UserError(in_the_trash(experiment, uri, "compare does not read", "name another --experiment"))
        race_target([], args.target_accuracy, args.target_loss)  # one target at most, said before anything is read
        if problem := unwritable([("--out", args.out, True)]):
            raise UserError(f"{problem} Nothing was compared.")
        jobs = load_jobs(client, experiment.experiment_id)
        if not jobs:
            raise UserError(f"Experiment {experiment.name!r} at {redact_uri(uri)} has no FINISHED jobs to compare"
                            f"{unfinished(client, experiment.experiment_id)}. Run some first: python -m mpi_train "
                            f"--experiment {experiment.name} ...")
    except UserError as error:
        print(format_error(str(error)), file=sys.stderr)
        return error.exit_code
    table = comparison(jobs, f"Jobs of {experiment.name!r}", args.target_accuracy, args.target_loss)
    print(table)
    others = {status: count for status, count in job_statuses(client, experiment.experiment_id).items()
              if status != "FINISHED"}
    if others:
        print(f"Left out: {', '.join(f'{count} {status}' for status, count in sorted(others.items()))} job(s), "
              f"whose figures are not whole.")
    predictions = prediction_rows(jobs)
    predicted = bool(prediction_points(predictions))
    paths, made = [], not Path(args.out).exists()
    failure = kept(f"the plots in --out {args.out}", lambda: paths.extend(
        plot(jobs, Path(args.out), args.target_accuracy, args.target_loss)
        + ([plot_predictions(predictions, Path(args.out))] if predicted else [])))
    if failure:
        if made:
            with contextlib.suppress(OSError):  # a folder it made and left empty goes; plots written stay
                Path(args.out).rmdir()
        print(format_error(f"the table above holds the comparison, but {failure}. Free space there, or name another "
                           f"folder with --out."), file=sys.stderr)
        return 2
    remove_stale(Path(args.out), paths)
    print("plots: " + ", ".join(str(p) for p in paths))
    if args.log_artifacts:
        print(f"logged as run {log_comparison(client, experiment.experiment_id, jobs, table, paths)}")
    return 0
