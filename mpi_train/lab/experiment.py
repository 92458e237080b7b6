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

The planned command lines are sweep_plan.py's, each launch with its progress sweep_launch.py's,
and the report sweep_report.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import ArgumentParser, UserError, format_error
from ..files import claim_folder, unwritable
from ..tracking import check_uri, probe_server, resolve_uri
from .experiment_file import Sweep, load
from .launchline import read_hostfile
from .sweep_launch import Launch, Progress, duration, execute
from .sweep_plan import describe_plan, lab_folder, plan
from .sweep_report import report
from .testhosts import TestHosts, check_can_run


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m mpi_train experiment", description=__doc__.split("\n")[0],
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
    return resolve_uri(sweep.tracking_uri)


def check_setup(sweep: Sweep, uri: str | None) -> None:
    """What would make every run fail, reported once before any is launched."""
    if shutil.which("mpirun") is None:
        raise UserError("mpirun is not on PATH. Install an MPI (pip install -e '.[mpi]' brings Open MPI) or load "
                        "your cluster's MPI module. Nothing was launched.")
    if sweep.network:
        check_can_run(sweep.network, sweep.path)
    if uri:
        try:
            if check_uri(uri) in ("http", "https"):
                probe_server(uri)
        except UserError as error:
            raise UserError(f"{error} (tracking for {sweep.path}; nothing was launched)") from None


def check_runs(sweep: Sweep, launches: list[Launch]) -> None:
    """What would fail runs the moment they start, said before --dry-run lists them: save_model without tracking, a
    hostfile that is not there or does not read, a run asking more ranks than its slots (mpirun refuses it: "not
    enough slots"), an output folder that cannot be one."""
    if problem := unwritable([("the output folder (--out, or out in the file)", str(sweep.out), True)]):
        raise UserError(f"{problem} Nothing was launched.")
    if not sweep.tracking and any(run.config.save_model for run in sweep.runs):
        raise UserError(f"{sweep.path}: save_model = true keeps each trained model in its MLflow run, and this "
                        f"experiment tracks nothing ([experiment] tracking = false, or --no-tracking). Drop "
                        f"save_model, or track the runs. Nothing was launched.")
    if not sweep.hostfile:
        return
    if not Path(sweep.hostfile).is_file():
        kind = "is a folder" if Path(sweep.hostfile).is_dir() else f"does not exist in {Path.cwd()}"
        raise UserError(f"the hostfile {sweep.hostfile!r} (--hostfile, or [launch] hostfile in {sweep.path}) {kind}. "
                        f"Run from the repository root, pass --hostfile PATH, or --hostfile \"\" to let mpirun run "
                        f"every rank here. Nothing was launched.")
    try:
        offered = sum(slots for _, slots in read_hostfile(Path(sweep.hostfile)))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UserError(f"the hostfile {sweep.hostfile} cannot be read: {error}. Write one host a line, "
                        f"`name slots=N`. Nothing was launched.") from None
    if any("oversubscribe" in arg.lower() for arg in sweep.mpirun_args):
        return
    over = [(launch.name, np) for launch in launches if "--hostfile" in launch.command
            and launch.command[launch.command.index("--hostfile") + 1] == sweep.hostfile
            and (np := int(launch.command[launch.command.index("-np") + 1])) > offered]
    if over:
        name, np = over[0]
        raise UserError(f"{sweep.path}: {len(over)} run(s) ask for more ranks than the hostfile {sweep.hostfile} "
                        f"offers ({offered} slot(s)), the first {name} with np {np}: mpirun would refuse them. Lower "
                        f"np, add slots to the hostfile, or add \"--oversubscribe\" to [launch] mpirun_args. Nothing "
                        f"was launched.")


def run_sweep(sweep: Sweep, launches: list[Launch], uri: str | None) -> int:
    """Each launch in order, then the report and what failed; exit 0, 1 if anything failed, 130 if interrupted."""
    since_ms = int(time.time() * 1000) - 1000
    progress = Progress(launches)
    interrupted = failed_setup = False
    current = None  # the launch under way: one interrupted is stopped, not "not run"
    try:
        with lab(sweep) as hosts:  # test hosts down on every way out of here
            for current in launches:
                if hosts is not None and current.network is not None:
                    hosts.apply(current.network)
                execute(current, progress, sweep.timeout)
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
    stopped = current if interrupted and current is not None and current.returncode is None else None
    skipped = [l for l in launches if l.returncode is None and l is not stopped]
    ok = len(launches) - len(failed) - len(skipped) - (stopped is not None)
    print(f"\n{ok} of {len(launches)} run(s) succeeded in {duration(time.monotonic() - progress.started)}.")
    for launch in failed:
        print(f"FAILED [{launch.index}/{len(launches)}] {launch.name} (exit {launch.returncode}): {launch.error}\n"
              f"    log: {launch.log}")
    if stopped is not None:
        print(f"stopped [{stopped.index}/{len(launches)}] {stopped.name}: interrupted while it ran\n"
              f"    log: {stopped.log}")
    for launch in skipped:
        print(f"not run [{launch.index}/{len(launches)}] {launch.name}")
    if interrupted:
        return 130
    return 1 if failed or failed_setup else 0


def lab(sweep: Sweep):
    """The sweep's test hosts as a context (None without a [network] table or with loopback only)."""
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
        check_runs(sweep, launches)
        if args.dry_run:
            print(describe_plan(sweep, launches, uri))
            return 0
        check_setup(sweep, uri)
        if holder := claim_folder(sweep.out):
            raise UserError(f"the output folder {sweep.out} (--out, or out in {sweep.path}) is in use by another "
                            f"experiment runner ({holder}): the two would write each other's logs, summaries and "
                            f"report. Wait for it to end, or pass --out OTHER. Nothing was launched.")
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
