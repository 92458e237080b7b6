"""The job under torchrun: the same losses as under mpirun, a killed rank ends the job, MPI never initialised.

Every job here is a real `torchrun --nproc-per-node 2` (python -m torch.distributed.run). A
stand-in mpi4py whose MPI module refuses to load sits first on the path of every torchrun
job, so any attempt to initialise MPI fails the job.
"""

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, client_for, job_runs, losses, train

from mpi_train.lab import mpirun as launch

pytestmark = pytest.mark.e2e

ENDS_WITHIN_S = 60


@pytest.fixture
def no_mpi(tmp_path) -> Path:
    """A folder that shadows mpi4py: importing mpi4py.MPI raises, so a job that initialises MPI fails."""
    package = tmp_path / "no_mpi" / "mpi4py"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "shadowed"\n')
    (package / "MPI.py").write_text('raise ImportError("MPI must not be initialised under torchrun or srun")\n')
    return package.parent


def torchrun(args: list[str], no_mpi: Path, *, nproc: int = 2, env: dict | None = None, timeout: float = 240):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "mpi_train", *args]
    return launch.run(command, env={**os.environ, "PYTHONPATH": f"{no_mpi}:{REPO}", "PYTHONUNBUFFERED": "1",
                                    **(env or {})},
                      timeout=timeout, cwd=REPO)


def test_torchrun_trains_one_job_with_the_losses_of_mpirun(tmp_path, quick_args, no_mpi):
    args = [*quick_args, "--max-steps", "6", "--sync", "allreduce"]
    summary = tmp_path / "torchrun.json"
    result = torchrun([*args, "--summary-json", str(summary)], no_mpi)
    assert result.returncode == 0, f"torchrun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    assert "2 rank(s) on 1 host(s)" in result.stdout  # one job of two ranks, not two jobs of one
    assert result.stdout.count("done in") == 1
    under_torchrun = json.loads(summary.read_text())
    under_mpirun = train(2, tmp_path, *args, name="mpirun")
    assert under_torchrun["world_size"] == 2
    assert len(losses(under_torchrun)) == len(losses(under_mpirun)) == 3
    assert losses(under_torchrun) == pytest.approx(losses(under_mpirun), rel=1e-6, abs=1e-7)


def test_a_killed_torchrun_rank_ends_the_job_and_keeps_the_record(mlflow_server, no_mpi):
    fault = "1:5:kill"
    started = time.time()
    result = torchrun(["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "2",
                       "--timeout", "10", "--tracking-uri", mlflow_server, "--experiment", "tests-torchrun",
                       "--run-name", "killed-rank"], no_mpi, env={"MPI_TRAIN_FAIL_AT": fault})
    ended = time.time()
    injected = re.search(r"injecting '\w+' on rank \d+ at \w+ \(unix time ([\d.]+)\)", result.stderr)
    assert injected, f"the fault was never injected:\n{result.stdout}\n{result.stderr}"
    assert result.returncode != 0
    assert ended - float(injected.group(1)) < ENDS_WITHIN_S, f"job took {ended - started:.0f} s in all"
    client = client_for(mlflow_server)
    deadline = time.monotonic() + 30
    while True:  # the guard process may record the end a moment after torchrun returns
        parent, children = job_runs(client, "tests-torchrun", "killed-rank")
        if parent.info.status != "RUNNING" and all(c.info.status != "RUNNING" for c in children):
            break
        assert time.monotonic() < deadline, "run left RUNNING"
        time.sleep(0.5)
    assert parent.info.status in ("FAILED", "KILLED")
    assert parent.data.params["world_size"] == "2"
    assert [m.step for m in client.get_metric_history(parent.info.run_id, "learning/loss")] == [2, 4]


def test_a_launcher_that_finds_fewer_ranks_than_torchrun_started_stops(no_mpi, quick_args):
    # --launcher mpi under torchrun: each process would be an MPI singleton, i.e. two one-rank jobs
    real_mpi = {"PYTHONPATH": str(REPO)}  # mpi4py must load here: it is the launcher asked for
    result = torchrun([*quick_args, "--max-steps", "2", "--launcher", "mpi"], no_mpi, env=real_mpi, timeout=120)
    assert result.returncode != 0
    text = " ".join(result.stderr.split())
    assert "WORLD_SIZE=2 says torchrun started 2 processes, but the mpi launcher found 1 rank(s)" in text
    assert "--launcher" in text
    # a clear error, not our traceback (torchrun prints its own)
    assert not re.search(r'File "[^"]*mpi_train/', result.stderr)
    assert "done in" not in result.stdout  # nobody trained


def test_torchrun_restarts_resume_from_the_checkpoint_into_the_same_run(mlflow_server, no_mpi, tmp_path):
    # 4 steps an epoch; checkpoints at steps 3 and 6; rank 1 killed at step 5 in the first attempt only. Local SGD
    # averaging every 2 steps: the checkpoint at step 3 holds each rank's own model, between two averages
    job = ["--dataset", "synthetic", "--synthetic-size", "256", "--batch-size", "64", "--epochs", "3", "--max-steps",
           "8", "--log-every", "1", "--checkpoint-every", "3", "--sync", "localsgd", "--period", "2"]
    fault = {"MPI_TRAIN_FAIL_AT": "1:5:kill", "MPI_TRAIN_FAIL_ONCE": str(tmp_path / "fault-happened")}
    summary = tmp_path / "restarted.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "1", "-m", "mpi_train", *job, "--checkpoint-dir", str(tmp_path / "ck"), "--resume",
               "auto", "--tracking-uri", mlflow_server, "--experiment", "tests-torchrun", "--run-name", "restarted",
               "--summary-json", str(summary)]
    result = launch.run(command, env={**os.environ, "PYTHONPATH": f"{no_mpi}:{REPO}", "PYTHONUNBUFFERED": "1",
                                      **fault}, timeout=240, cwd=REPO)
    assert result.returncode == 0, f"torchrun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    assert result.stderr.count("injecting 'kill'") == 1
    restarted = json.loads(summary.read_text())
    whole = train(2, tmp_path, *job, "--checkpoint-dir", str(tmp_path / "ck-whole"), "--no-tracking", name="whole")
    assert restarted["resumed_from"]["step"] == 3
    assert restarted["weights_sha256"] == whole["weights_sha256"]
    client = client_for(mlflow_server)
    parent, _ = job_runs(client, "tests-torchrun", "restarted")
    assert parent.info.status == "FINISHED" and parent.data.tags["mpi_train.attempts"] == "2"
    history = client.get_metric_history(parent.info.run_id, "learning/loss")
    assert sorted(m.step for m in history) == list(range(1, 9))
