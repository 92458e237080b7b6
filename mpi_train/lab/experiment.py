"""`python -m mpi_train experiment FILE.toml`: run every configuration of an experiment file with mpirun, then report.

    python -m mpi_train experiment experiments/compare_sync.toml
    python -m mpi_train experiment experiments/smoke.toml --dry-run

The file (see mpi_train/lab/experiment_file.py for its keys) is checked whole before anything starts.
Each run is one `mpirun -np N --hostfile hostfile python -m mpi_train ...`, filed under the
file's MLflow experiment; its output goes to OUT/logs/, its summary to OUT/runs/, and the
console shows which run of how many is going, its step and the time left. A failed run is
reported and the sweep goes on. With a [bench] table, `python -m mpi_train bench` runs once
at the end. The report (compare.py's table and plots, the bench's cost table and its plot
against the cost-model floor) is printed and written to OUT/report.txt; with tracking on it
is also stored as a comparison run. Exit status: 0 if every run succeeded, 1 if any failed,
2 if the file or the setup is wrong.

With a [network] table the runs are grouped by network setting (hosts × link): the test
hosts come up once (mpi_train/lab/testhosts.py), each setting's links are shaped before its runs,
its [bench] runs first (its fitted links become the runs' --calibration), and the hosts are
taken down at the end, on failure and on Ctrl-C. The report adds predicted against measured
sync time per method and setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis import model_accuracy
from ..analysis.compare import (
    comparison,
    job_from_summary,
    load_jobs,
    log_comparison,
    plot,
    plot_predictions,
    plot_sync_costs,
    prediction_rows,
)
from ..commands.bench import describe
from ..config import ENV_DEFAULTS, TrainConfig, redact_uri
from ..errors import UserError, format_error
from ..tracking import check_uri, default_store_uri, mlflow_client, probe_server
from ..tracking.links import share_views, where
from .experiment_file import BenchPlan, PlannedRun, Sweep, load
from .mpirun import own_tmpdir, start, stop
from .network import NetworkSetting
from .testhosts import TestHosts, check_can_run

STEP_LINE = re.compile(r"step\s+(\d+)/(\d+)")  # training's and the bench's progress lines
UNBUFFERED_ENV = {"PYTHONUNBUFFERED": "1"}  # progress lines must arrive as they are printed
DATASET_SIZES = {"cifar10": 50_000, "mnist": 60_000}  # training images, to estimate steps before a run starts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mpi_train experiment", description=__doc__.split("\n")[0],
                                     epilog="Example: python -m mpi_train experiment experiments/smoke.toml")
    parser.add_argument("file", help="experiment file (.toml), e.g. experiments/compare_sync.toml")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the file and list the planned runs and their commands; launch nothing")
    parser.add_argument("--hostfile", help='hostfile for mpirun, overriding the file\'s [launch] hostfile ("" for '
                                           'none)')
    parser.add_argument("--data-dir", help="data folder for every run, overriding the file's data_dir")
    parser.add_argument("--tracking-uri", help="MLflow server or database, overriding the file (default: the file's, "
                                               "else $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db)")
    parser.add_argument("--no-tracking", action="store_true",
                        help="record nothing in MLflow; the report reads the runs' summary files")
    parser.add_argument("--out", help="folder for logs, summaries, plots and the report, overriding the file's")
    parser.add_argument("--no-bench", action="store_true", help="skip the file's [bench] run")
    return parser


def apply_overrides(sweep: Sweep, args: argparse.Namespace) -> Sweep:
    """Command-line flags win over the file."""
    changes: dict = {}
    if args.hostfile is not None:
        changes["hostfile"] = args.hostfile or None
    if args.tracking_uri:
        changes["tracking_uri"] = args.tracking_uri
    if args.no_tracking:
        changes["tracking"] = False
    if args.out:
        changes["out"] = Path(args.out)
    if args.no_bench:
        changes["bench"] = None
    if args.data_dir:
        changes["runs"] = tuple(dataclasses.replace(run, config=dataclasses.replace(run.config, data_dir=args.data_dir))
                                for run in sweep.runs)
    return dataclasses.replace(sweep, **changes)


def tracking_uri(sweep: Sweep) -> str | None:
    """Where every run of the sweep is filed, decided once (None with tracking off)."""
    if not sweep.tracking:
        return None
    return sweep.tracking_uri or os.environ.get(ENV_DEFAULTS["tracking_uri"]) or default_store_uri()


def check_setup(sweep: Sweep, uri: str | None) -> None:
    """What would make every run fail, reported once before any is launched."""
    if shutil.which("mpirun") is None:
        raise UserError("mpirun is not on PATH. Install an MPI (pip install -e '.[mpi]' brings Open MPI) or load "
                        "your cluster's MPI module. Nothing was launched.")
    if sweep.hostfile and not Path(sweep.hostfile).is_file():
        raise UserError(f"the hostfile {sweep.hostfile!r} (from [launch] hostfile in {sweep.path}) does not exist in "
                        f"{Path.cwd()}. Run from the repository root, pass --hostfile PATH, or --hostfile \"\" to "
                        f"let mpirun run every rank here. Nothing was launched.")
    if sweep.network:
        check_can_run(sweep.network, sweep.path)
    if uri:
        try:
            if check_uri(uri) in ("http", "https"):
                probe_server(uri)
        except UserError as error:
            raise UserError(f"{error} (tracking for {sweep.path}; nothing was launched)") from None


# ---------------------------------------------------------------------------------------------
# Commands.

def mpirun_prefix(sweep: Sweep, np: int, setting: NetworkSetting | None = None) -> list[str]:
    """mpirun with the hostfile and Open MPI's settings for this machine, as the README's launch line has them."""
    command = ["mpirun", "-np", str(np)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")  # Open MPI refuses root (containers) without it
    hostfile = str(lab_hostfile(sweep, setting)) if setting and setting.hosts > 1 else sweep.hostfile
    if hostfile:
        command += ["--hostfile", hostfile]
    return command + list(sweep.mpirun_args)


def lab_folder(sweep: Sweep) -> Path:
    return sweep.out / "network"


def lab_hostfile(sweep: Sweep, setting: NetworkSetting) -> Path:
    return lab_folder(sweep) / f"hostfile-{setting.hosts}x{setting.ranks_per_host}"  # written by TestHosts.hostfile


def bench_json(sweep: Sweep, setting: NetworkSetting | None) -> Path:
    return sweep.out / (f"bench-{setting.label}.json" if setting else "bench.json")


def train_flags(config: TrainConfig) -> list[str]:
    """The options of `python -m mpi_train` that differ from its defaults (sync and seed always)."""
    defaults = TrainConfig()
    flags = []
    for item in dataclasses.fields(TrainConfig):
        value = getattr(config, item.name)
        if value == getattr(defaults, item.name) and item.name not in ("sync", "seed"):
            continue
        flag = "--" + item.name.replace("_", "-")
        if isinstance(value, bool):
            flags += [flag] if value else []
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def run_command(sweep: Sweep, run: PlannedRun, uri: str | None, summary: Path) -> list[str]:
    tracking = {"experiment": sweep.name, "tracking_uri": uri} if uri else {"no_tracking": True}
    timelines = {"timeline_dir": str(sweep.out / "timelines")} if run.config.timeline_window else {}
    config = dataclasses.replace(run.config, summary_json=str(summary), run_name=run.name, **timelines, **tracking)
    return [*mpirun_prefix(sweep, run.np, run.network), sys.executable, "-m", "mpi_train", *train_flags(config)]


def bench_command(sweep: Sweep, bench: BenchPlan, uri: str | None, json_path: Path,
                  setting: NetworkSetting | None = None) -> list[str]:
    np = setting.slots if setting else bench.np
    command = [*mpirun_prefix(sweep, np, setting), sys.executable, "-m", "mpi_train", "bench", "--model", bench.model,
               "--batch-size", str(bench.batch_size), "--steps", str(bench.steps), "--warmup", str(bench.warmup),
               "--json", str(json_path)] + (["--link", setting.link] if setting else [])
    if bench.gpt_size:
        command += ["--gpt-size", bench.gpt_size]
    if bench.methods:
        command += ["--methods", ",".join(bench.methods)]
    if uri:
        name = f"bench-{sweep.name}" + (f"-{setting.label}" if setting else "")
        return command + ["--experiment", sweep.name, "--tracking-uri", uri, "--run-name", name]
    return command + ["--no-tracking"]


def estimated_steps(run: PlannedRun) -> int:
    """Steps the run will take, known before it starts (it prints the exact number when it does): for a data set of
    unknown size (text, an image folder, the user's own) its --max-steps, else 0 until it prints them."""
    config = run.config
    size = config.synthetic_size if config.dataset == "synthetic" else DATASET_SIZES.get(config.dataset)
    if size is None:
        return config.max_steps or 0
    per_rank = config.batch_size // run.np
    steps_per_epoch = math.ceil(math.ceil(size / run.np) / per_rank)  # DistributedSampler pads each shard
    total = config.epochs * steps_per_epoch
    return min(total, config.max_steps) if config.max_steps else total


# ---------------------------------------------------------------------------------------------
# Launching, with progress.

@dataclass
class Launch:
    """One mpirun of the sweep: a training run or the bench."""

    index: int
    name: str
    command: list[str]
    steps: int
    log: Path
    env: dict = field(default_factory=dict)
    network: NetworkSetting | None = None  # the hosts and link it runs on ([network] table)
    calibration: Path | None = None  # a bench JSON whose links predict its sync, passed if the bench wrote it
    returncode: int | None = None
    seconds: float = 0.0
    steps_done: int = 0
    error: str = ""
    first: tuple[float, int] | None = None  # (seconds since start, step) of its first progress line
    last: tuple[float, int] | None = None  # and of its latest

    def seconds_per_step(self) -> float | None:
        """Its pace between progress lines: start-up (imports, data, rendezvous) excluded."""
        if self.first and self.last and self.last[1] > self.first[1]:
            return (self.last[0] - self.first[0]) / (self.last[1] - self.first[1])
        return None

    def startup(self) -> float | None:
        """Seconds before its first step: the part of a run that does not scale with steps."""
        pace = self.seconds_per_step()
        return max(0.0, self.first[0] - self.first[1] * pace) if pace is not None else None


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Which run of how many, its step, the elapsed time and an estimate of the time left."""

    def __init__(self, launches: list[Launch]):
        self.launches = launches
        self.started = time.monotonic()

    def estimate_left(self, current: Launch) -> float | None:
        """The current run's steps at its own pace, then each later run as start-up plus steps at the pace seen
        so far."""
        finished = [l for l in self.launches if l.returncode == 0 and l.seconds_per_step() is not None]
        paces = [l.seconds_per_step() for l in finished]
        mean_pace = sum(paces) / len(paces) if paces else None
        pace = current.seconds_per_step() or mean_pace
        if pace is None:
            return None
        if mean_pace is None:
            mean_pace = pace
        startups = [l.startup() for l in finished] or [current.startup() or 0.0]
        startup = sum(startups) / len(startups)
        later = [l for l in self.launches if l.index > current.index]
        return max(0, current.steps - current.steps_done) * pace + sum(startup + l.steps * mean_pace for l in later)

    def line(self, current: Launch, run_elapsed: float) -> str:
        left = self.estimate_left(current)
        eta = f", ~{_duration(left)} left (estimate)" if left is not None else ""
        return (f"[{current.index}/{len(self.launches)}] {current.name}: step {current.steps_done}/{current.steps}, "
                f"run {_duration(run_elapsed)}, sweep {_duration(time.monotonic() - self.started)}{eta}")


FAILURE_LINES = (  # what says why a run failed, most telling first
    # the remote agent's own words when mpirun could not reach a host (`ssh: Could not resolve hostname h: ...`),
    # which the banner mpirun prints after them ("A daemon failed to report back") leaves out
    re.compile(r"^(ssh|rsh): \S"),
    re.compile(r"^\s*[\w.]*(Error|Exception|Interrupt)\b.*?:"),  # a traceback's last line
    re.compile(r"mpi_train[\w.]*: (error|warning)"),  # a one-paragraph error
    re.compile(r"(failed|Killed|killed|not found|refused)"),
)


def _last_error(lines: list[str]) -> str:
    """The line that says why a run failed: the remote agent's error when a host could not be reached, the run's
    exception or error message, else the last line it printed."""
    for pattern in FAILURE_LINES:
        for line in reversed(lines):
            if pattern.search(line):
                return line.strip()
    return next((line.strip() for line in reversed(lines) if line.strip()), "(no output)")


def execute(launch: Launch, progress: Progress, timeout: float | None) -> None:
    """Run one mpirun, logging its output and printing progress; never raises for a failed run."""
    launch.log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tail: list[str] = []
    print(f"[{launch.index}/{len(progress.launches)}] {launch.name}: starting", flush=True)
    command = launch.command
    if launch.calibration and launch.calibration.is_file():
        command = command + ["--calibration", str(launch.calibration)]
    with open(launch.log, "w") as log, own_tmpdir() as tmp_env:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        process = start(command, {**os.environ, **UNBUFFERED_ENV, **launch.env, **tmp_env},
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        timer = threading.Timer(timeout, _stop, (process, launch)) if timeout else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            for line in process.stdout:
                log.write(line)
                log.flush()
                tail = (tail + [line.rstrip("\n")])[-40:]
                match = STEP_LINE.search(line)
                if match:
                    launch.steps_done, launch.steps = int(match.group(1)), int(match.group(2))
                    launch.last = (time.monotonic() - started, launch.steps_done)
                    launch.first = launch.first or launch.last
                    print(progress.line(launch, launch.last[0]), flush=True)
            process.wait()
        except KeyboardInterrupt:
            _stop(process, launch, reason="interrupted")
            raise
        finally:
            if timer:
                timer.cancel()
    launch.seconds = time.monotonic() - started
    launch.returncode = process.returncode
    if process.returncode == 0:
        print(f"[{launch.index}/{len(progress.launches)}] {launch.name}: done in {_duration(launch.seconds)}",
              flush=True)
    else:
        launch.error = launch.error or _last_error(tail)
        print(f"[{launch.index}/{len(progress.launches)}] {launch.name}: FAILED (exit {process.returncode}) after "
              f"{_duration(launch.seconds)}: {launch.error}\n    full output: {launch.log}", flush=True)


def _stop(process: subprocess.Popen, launch: Launch, reason: str = "") -> None:
    """End the run's whole process group (mpirun and its ranks)."""
    launch.error = reason or "stopped: it ran past [launch] timeout"
    stop(process)


# ---------------------------------------------------------------------------------------------
# Planning and reporting.

def plan(sweep: Sweep, uri: str | None) -> list[Launch]:
    if sweep.network:
        return plan_network(sweep, uri)
    out = sweep.out
    launches = [Launch(run.index, run.name, run_command(sweep, run, uri, out / "runs" / f"{run.name}.json"),
                       estimated_steps(run), out / "logs" / f"{run.index:02d}-{run.name}.log", run.env)
                for run in sweep.runs]
    if sweep.bench:
        b = sweep.bench
        launches.append(Launch(len(launches) + 1, f"bench-np{b.np}", bench_command(sweep, b, uri, out / "bench.json"),
                               b.steps + b.warmup, out / "logs" / f"{len(launches) + 1:02d}-bench.log"))
    return launches


def plan_network(sweep: Sweep, uri: str | None) -> list[Launch]:
    """Per network setting: its bench first (the runs' calibration), then its runs; settings in [network] order."""
    out, launches = sweep.out, []
    for setting in sweep.network.settings:
        env = TestHosts.launch_env(setting)
        calibration = None
        if sweep.bench and setting in sweep.bench.settings:
            b, index = sweep.bench, len(launches) + 1
            calibration = bench_json(sweep, setting)
            launches.append(Launch(index, f"bench-np{setting.slots}-{setting.label}",
                                   bench_command(sweep, b, uri, calibration, setting), b.steps + b.warmup,
                                   out / "logs" / f"{index:02d}-bench-{setting.label}.log", env, setting))
        for run in (r for r in sweep.runs if r.network == setting):
            index = len(launches) + 1
            launches.append(Launch(index, run.name, run_command(sweep, run, uri, out / "runs" / f"{run.name}.json"),
                                   estimated_steps(run), out / "logs" / f"{index:02d}-{run.name}.log",
                                   {**env, **run.env}, setting, calibration))
    return launches


def describe_plan(sweep: Sweep, launches: list[Launch], uri: str | None) -> str:
    lines = [(f"{sweep.path}: experiment {sweep.name!r}, {len(launches)} run(s), tracking "
              f"{redact_uri(uri) if uri else 'off'}, output in {sweep.out}/")]
    if sweep.description:
        lines.append(f"  {sweep.description}")
    for method, why in sweep.unavailable:
        lines.append(f"unavailable, not launched: {method}: {why}")
    for launch in launches:
        env = "".join(f"{k}={v} " for k, v in launch.env.items())
        lines.append(f"[{launch.index}/{len(launches)}] {launch.name} (~{launch.steps} steps)\n"
                     f"    {env}{' '.join(launch.command)}")
    return "\n".join(lines)


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
        if any(row["predicted_s"] is not None for row in predictions):
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


def run_sweep(sweep: Sweep, launches: list[Launch], uri: str | None) -> int:
    since_ms = int(time.time() * 1000) - 1000
    progress = Progress(launches)
    interrupted = failed_setup = False
    try:
        with lab(sweep) as hosts:  # test hosts down on every way out of here
            for launch in launches:
                if hosts is not None and launch.network is not None:
                    hosts.apply(launch.network)
                execute(launch, progress, sweep.timeout)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: the current run was stopped; reporting what finished.", file=sys.stderr)
    except UserError as error:  # the test hosts could not be set up or shaped: the remaining runs cannot be made
        print(format_error(f"{error} The sweep stopped; reporting what finished."), file=sys.stderr)
        failed_setup = True
    try:
        report(sweep, uri, launches, since_ms)
    except Exception as error:  # noqa: BLE001 - the runs are done; say why the report is missing
        print(format_error(f"the report could not be made ({type(error).__name__}: {error}); the runs' logs and "
                           f"summaries are in {sweep.out}/."), file=sys.stderr)
        return 1
    failed = [l for l in launches if l.returncode not in (0, None)]
    skipped = [l for l in launches if l.returncode is None]
    ok = len(launches) - len(failed) - len(skipped)
    print(f"\n{ok} of {len(launches)} run(s) succeeded in {_duration(time.monotonic() - progress.started)}.")
    for launch in failed:
        print(f"FAILED [{launch.index}/{len(launches)}] {launch.name} (exit {launch.returncode}): {launch.error}\n"
              f"    log: {launch.log}")
    for launch in skipped:
        print(f"not run [{launch.index}/{len(launches)}] {launch.name}")
    if interrupted:
        return 130
    return 1 if failed or failed_setup else 0


def lab(sweep: Sweep):
    """The sweep's test hosts as a context (None without a [network] table or with loopback only)."""
    import contextlib

    if not sweep.network or sweep.network.max_hosts <= 1:
        return contextlib.nullcontext(None)
    hosts = TestHosts(sweep.network, lab_folder(sweep))

    @contextlib.contextmanager
    def managed():
        with hosts:
            for setting in sweep.network.settings:
                if setting.hosts > 1:
                    hosts.hostfile(setting.hosts, setting.ranks_per_host)
            yield hosts

    return managed()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sweep = apply_overrides(load(args.file), args)
        uri = tracking_uri(sweep)
        launches = plan(sweep, uri)
        if args.dry_run:
            print(describe_plan(sweep, launches, uri))
            return 0
        check_setup(sweep, uri)
    except UserError as error:
        print(format_error(str(error), prog="mpi_train experiment"), file=sys.stderr)
        return error.exit_code
    print("\n".join(line for i, line in enumerate(describe_plan(sweep, launches, uri).splitlines())
                    if i == 0 or line.startswith("unavailable")), flush=True)
    sweep.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)  # a killed runner still stops its run and takes its test hosts down
    return run_sweep(sweep, launches, uri)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
