"""The bad-input probe's faults of what a job runs among rather than of its flags or data: a launcher's variables left
over in a shell, an output whose reader goes away, a tracking address that is no MLflow server, a store another MLflow
made (bad_input_cases.py holds the rest; bad_input.py runs them all)."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys

from ..tracking.probe import wait_for_server
from ..tracking.spool import Spool
from .bad_input_cases import SMALL, TRACKED
from .bad_input_judge import Run
from .bad_input_workspace import Case, NotRunnable, Workspace
from .mpirun import launched

TORCHRUN_LEFT = ("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1")
SLURM_LEFT = ("SLURM_PROCID=0", "SLURM_LOCALID=0", "SLURM_NODEID=0", "SLURM_STEP_ID=0", "SLURM_NTASKS=2",
              "SLURM_JOB_NODELIST=node[01-02]", "SLURM_JOB_ID=77")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun_left_over(ws: Workspace) -> list[list[str]]:
    """torchrun's variables exported in the shell, no torchrun: rank 0 of 2 waits for a rank that never comes."""
    return [["env", *TORCHRUN_LEFT, f"MASTER_PORT={free_port()}", *ws.command(*SMALL, "--timeout", "5")]]


def slurm_left_over(ws: Workspace) -> list[list[str]]:
    return [["env", *SLURM_LEFT, *ws.command(*SMALL)]]


def output_reader_ends(ws: Workspace) -> list[list[str]]:
    """`python -m mpi_train ... | head -1`, the job's exit status kept."""
    line = " ".join(ws.command(*SMALL, "--epochs", "100", "--max-steps", "400"))
    return [["bash", "-c", f"{line} | head -1 >/dev/null; exit ${{PIPESTATUS[0]}}"]]


def replay_to_another_server(ws: Workspace) -> list[list[str]]:
    """A spool replayed to an address where another web service answers, its own /health among its pages (as many
    services have one): nothing may be marked sent."""
    port = free_port()
    (ws.aside / "health").write_text("OK\n")
    ws.stack.enter_context(launched([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                    os.environ, cwd=ws.aside, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    spool = Spool(ws.folder / "mlruns" / "spool" / "job-1.jsonl")
    spool.add({"kind": "create_run", "local_id": "offline-1", "experiment": "e", "run_name": "r", "tags": {},
               "start_time": 0}, "http://127.0.0.1:1")
    uri = f"http://127.0.0.1:{port}"
    if wait_for_server(uri, 10, every_s=0.1) is not None:  # its /health, as the replay asks it
        raise NotRunnable("the web server never answered")
    return [ws.command("replay", "--tracking-uri", uri)]


def spool_kept(ws: Workspace, runs: list[Run]) -> list[str]:
    spool = Spool(ws.folder / "mlruns" / "spool" / "job-1.jsonl")
    return [] if len(spool) == 1 and not spool.acked_path.exists() else ["SPOOL SENT OR MARKED"]


def store_of_another_mlflow(ws: Workspace) -> list[list[str]]:
    """The default store, its tables labelled as an older MLflow's."""
    from ..tracking.store import mlflow_client  # here, not at the top: the other cases need no MLflow

    database = ws.folder / "mlruns" / "mlflow.db"
    mlflow_client(f"sqlite:///{database}")
    with sqlite3.connect(database) as db:
        db.execute("UPDATE alembic_version SET version_num = '0c779009ac13'")
    return [ws.train(*TRACKED, "--max-steps", "2")]


CASES = [
    Case("torchrun-vars-left-over", torchrun_left_over,
         (r"did not meet at 127\.0\.0\.1:\d+ .{0,300}within --timeout 5 s", r"left over from elsewhere"), timeout_s=60),
    Case("slurm-vars-left-over", slurm_left_over, (r"node01 does not resolve on this host", r"left over")),
    Case("output-reader-ends", output_reader_ends, (r"standard output takes no more lines",)),
    Case("replay-to-another-server", replay_to_another_server, (r"a page that is not MLflow's", r"is kept"),
         check=spool_kept),
    Case("store-of-another-mlflow", store_of_another_mlflow, (r"made by another version of MLflow",
                                                              r"mlflow db upgrade")),
    Case("timeout-too-small", lambda ws: [ws.train(*SMALL, "--timeout", "0.001")], (r"--timeout 0\.001 is out of",)),
    Case("experiment-empty-name", lambda ws: [ws.train(*TRACKED, "--experiment", "")], (r"an empty name",)),
]
