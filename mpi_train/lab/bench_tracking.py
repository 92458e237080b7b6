"""`python -m mpi_train bench-tracking`: what experiment tracking costs a training step.

Runs the same short job with tracking off and on (against a real MLflow server over
HTTP, started here on a free loopback port unless --tracking-uri names one), alternating
which goes first so that background load hits both alike, and prints the wall time per
step (everything the loop does, logging included) and the on/off ratio. It also prints
the time the training loop itself spent in the tracker (queueing only; the HTTP calls
happen on a background thread) as a share of step time: the budget is 1%.

    python -m mpi_train bench-tracking --np 2 --steps 60 --log-every 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import ArgumentParser
from ..tracking import names
from ..tracking.probe import wait_for_server
from ..tracking.store import mlflow_client
from . import mpirun

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m mpi_train bench-tracking", description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=2, help="ranks per job (default: 2)")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per job (default: 60)")
    parser.add_argument("--log-every", type=int, default=1, help="log every N steps; 1 is the worst case (default: 1)")
    parser.add_argument("--repeats", type=int, default=2, help="off/on pairs to run (default: 2)")
    parser.add_argument("--tracking-uri",
                        help="server to log to (default: start one on a free loopback port for the benchmark)")
    parser.add_argument("--train-args", default="--dataset synthetic --synthetic-size 4096 --batch-size 64",
                        help="further arguments of the job (default: %(default)s)")
    return parser


def start_server(folder: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "mpi_train", "server", "--port", str(port), "--workers", "1"],
                              cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)})
    uri = f"http://127.0.0.1:{port}"
    if wait_for_server(uri, 120, every_s=0.5, gave_up=lambda: server.poll() is not None) is None:
        return server, uri
    server.terminate()
    raise SystemExit("bench_tracking: the MLflow server did not start")


def run_job(args, folder: Path, name: str, tracking: str | None) -> dict:
    summary = folder / f"{name}.json"
    command = ["mpirun", "-np", str(args.np), "--oversubscribe", sys.executable, "-m", "mpi_train",
               *args.train_args.split(), "--max-steps", str(args.steps), "--log-every", str(args.log_every),
               "--summary-json", str(summary),
               *(["--tracking-uri", tracking, "--experiment", "bench_tracking", "--run-name", name] if tracking
                 else ["--no-tracking"])]
    result = mpirun.run(command, env={**os.environ, **mpirun.OPEN_MPI_ENV, "PYTHONPATH": str(PACKAGE_ROOT)}, cwd=folder)
    if result.returncode:
        raise SystemExit(f"bench_tracking: job {name} failed:\n{result.stdout}\n{result.stderr}")
    return json.loads(summary.read_text())


def per_step(summary: dict) -> float:
    """Wall time per step of the whole loop (logging, gathers and the final evaluation included)."""
    return summary["wall_time_s"] / summary["total_steps"]


def tracking_share(uri: str, name: str) -> float:
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name("bench_tracking")
    (run,) = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
    return run.data.metrics[names.summary_key("tracking_share")]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench_tracking_"))
    server = None
    try:
        uri = args.tracking_uri
        if not uri:
            server, uri = start_server(folder)
        off, on, shares = [], [], []  # wall time per step: the loop's logging and gathers included
        stamp = int(time.time())
        for repeat in range(args.repeats):
            name = f"on-{stamp}-{repeat}"
            for tracked in ((False, True) if repeat % 2 == 0 else (True, False)):  # alternate which goes first
                if tracked:
                    on.append(per_step(run_job(args, folder, name, uri)))
                else:
                    off.append(per_step(run_job(args, folder, f"off-{repeat}", None)))
            shares.append(tracking_share(uri, name))
            print(f"pair {repeat + 1}: step {1000 * off[-1]:.2f} ms off, {1000 * on[-1]:.2f} ms on, "
                  f"in-loop tracking {100 * shares[-1]:.3f}% of step time", flush=True)
        ratio = statistics.fmean(on) / statistics.fmean(off)
        print(f"\n{args.np} ranks, {args.steps} steps, logging every {args.log_every} step(s), tracking to {uri}")
        print(f"wall time per step: tracking off {1000 * statistics.fmean(off):.2f} ms, "
              f"on {1000 * statistics.fmean(on):.2f} ms")
        print(f"ratio on/off: {ratio:.4f}  (noise of a shared machine included)")
        print(f"time the training loop spent in the tracker: {100 * statistics.fmean(shares):.3f}% of step time "
              f"(budget 1%)")
    finally:
        if server is not None:
            server.terminate()  # the server command stops mlflow and its workers on SIGTERM
            server.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
    return 0
