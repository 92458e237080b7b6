"""python -m mpi_train supervise around real mpirun jobs: a fault a restart fixes is relaunched into the same MLflow
run and ends as if never stopped; bad input, a rank's own error and a failure that repeats are not retried."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, client_for, job_runs, losses, mpirun_launch, train

from mpi_train.lab import mpirun as launch

pytestmark = pytest.mark.e2e

# 256 samples at a global batch of 64: 4 steps an epoch; checkpoints at steps 3 and 6, the fault at step 5
JOB = ["--dataset", "synthetic", "--synthetic-size", "256", "--batch-size", "64", "--epochs", "3", "--max-steps", "8",
       "--log-every", "1", "--checkpoint-every", "3"]


def supervise(tmp_path, args: list[str], env: dict | None = None, max_restarts: int = 2) -> subprocess.CompletedProcess:
    line, line_env = mpirun_launch(2, args)
    command = [sys.executable, "-m", "mpi_train", "supervise", "--max-restarts", str(max_restarts), "--backoff", "0.5",
               "--", *line]
    return launch.run(command, env={**line_env, **(env or {})}, timeout=240, cwd=tmp_path)


def job_processes(marker: str) -> list[str]:
    listed = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, check=False).stdout
    return [line for line in listed.splitlines() if "pgrep" not in line]


def test_a_killed_rank_is_relaunched_into_the_same_run_and_ends_as_if_never_stopped(mlflow_server, tmp_path):
    checkpoints = tmp_path / "ck-supervised"
    # rank 0 killed right after writing the step-3 checkpoint, before sending the metrics it covers: the relaunch
    # sends them (the checkpoint holds them), so steps 1-3 are logged too, once
    fault = {"MPI_TRAIN_FAIL_AT": "0:checkpointed:kill", "MPI_TRAIN_FAIL_ONCE": str(tmp_path / "fault-happened")}
    result = supervise(tmp_path, [*JOB, "--checkpoint-dir", str(checkpoints), "--tracking-uri", mlflow_server,
                                  "--experiment", "tests-supervise", "--run-name", "supervised",
                                  "--summary-json", str(tmp_path / "supervised.json")], env=fault)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "attempt 1 failed (exit status 137, latest checkpoint: step 3)" in result.stderr, result.stderr
    assert "relaunching with --resume auto" in result.stderr and "the job finished (attempt 2" in result.stderr
    assert job_processes(str(checkpoints)) == []

    whole = train(2, tmp_path, *JOB, "--checkpoint-dir", str(tmp_path / "ck-whole"), "--no-tracking", name="whole")
    resumed = json.loads((tmp_path / "supervised.json").read_text())
    assert resumed["resumed_from"]["step"] == 3
    assert resumed["weights_sha256"] == whole["weights_sha256"]  # bit for bit

    client = client_for(mlflow_server)
    parent, children = job_runs(client, "tests-supervise", "supervised")  # exactly one parent run of that name
    assert parent.info.status == "FINISHED" and all(c.info.status == "FINISHED" for c in children)
    assert parent.data.tags["mpi_train.attempts"] == "2"
    cause = parent.data.tags["mpi_train.restart.1"]
    assert cause == "attempt 1 ended KILLED (rank 0 ended without recording the run); attempt 2 resumed from step 3"
    assert "mpi_train.killed_by" not in parent.data.tags  # the first attempt's end is history now
    assert parent.data.metrics["summary/restarts"] == 1
    history = client.get_metric_history(parent.info.run_id, "learning/loss")
    assert sorted(m.step for m in history) == list(range(1, 9))  # each step once, the ones after step 3 included
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(losses(whole), rel=1e-6)
    rank1 = client.get_metric_history(children[1].info.run_id, "rank/loss")
    assert sorted(m.step for m in rank1) == list(range(1, 9))


def test_bad_input_a_rank_error_and_a_repeated_failure_are_not_retried(mlflow_server, tmp_path):
    bad = supervise(tmp_path, [*JOB, "--checkpoint-dir", "ck-bad", "--no-tracking", "--batch-size", "7"])
    assert bad.returncode == 2
    assert "--batch-size 7 is the global batch" in bad.stderr  # the job's own message, once
    assert "attempt 1 failed (exit status 2, no checkpoint) and is not relaunched" in bad.stderr

    bug = supervise(tmp_path, [*JOB, "--checkpoint-dir", "ck-bug", "--no-tracking"],
                    env={"MPI_TRAIN_FAIL_AT": "1:2:raise"})
    assert bug.returncode == 1
    assert bug.stderr.count("injecting 'raise'") == 1, bug.stderr
    assert "not relaunched: a rank raised an error of its own (InjectedFailure" in bug.stderr

    # killed at step 2 in every launch, before the first checkpoint: each relaunch starts again from step 0, in the
    # run the first attempt opened (its id beside the checkpoints), until the same failure comes back
    repeated = supervise(tmp_path, [*JOB, "--checkpoint-dir", "ck-again", "--tracking-uri", mlflow_server,
                                    "--experiment", "tests-supervise", "--run-name", "repeated"],
                         env={"MPI_TRAIN_FAIL_AT": "1:2:kill"}, max_restarts=3)
    assert repeated.returncode == 137
    assert repeated.stderr.count("injecting 'kill'") == 2, repeated.stderr
    assert "not relaunched: it failed the same way twice (exit status 137) with no checkpoint in between" \
        in repeated.stderr
    client = client_for(mlflow_server)
    parent, _ = job_runs(client, "tests-supervise", "repeated")  # one run for both attempts
    assert parent.info.status == "FAILED" and parent.data.tags["mpi_train.attempts"] == "2"
    assert parent.data.tags["mpi_train.restart.1"].endswith("attempt 2 started again (no checkpoint yet)")
    assert client.get_metric_history(parent.info.run_id, "learning/loss") == []  # no step is covered by a checkpoint

    # a launch line its launcher refuses (an option it does not know): no rank starts, and it is not relaunched
    line, line_env = mpirun_launch(2, [*JOB, "--checkpoint-dir", "ck-line", "--no-tracking"])
    unknown = launch.run([sys.executable, "-m", "mpi_train", "supervise", "--backoff", "0.5", "--", line[0],
                          "--no-such-launcher-option", *line[1:]], env=line_env, timeout=60, cwd=tmp_path)
    assert unknown.returncode not in (0, 2) and "no-such-launcher-option" in unknown.stderr
    assert "attempt 1 failed (exit status" in unknown.stderr and "not relaunched: the launch line ended before any " \
        "rank of the job printed a line" in unknown.stderr, unknown.stderr

    def refused(*flags: str, line: tuple[str, ...] = ("mpirun", "-np", "2", "python", "-m", "mpi_train")) -> str:
        done = subprocess.run([sys.executable, "-m", "mpi_train", "supervise", *flags, "--", *line],
                              capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 2, done.stderr
        return " ".join(done.stderr.split())

    assert "has no --checkpoint-dir" in refused()
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=2\n")
    on_hosts = ("mpirun", "-np", "4", "--hostfile", str(hostfile), "python", "-m", "mpi_train", "--checkpoint-dir",
                "ck")
    assert "--max-ranks 1 is below --min-ranks 2" in refused("--min-ranks", "2", "--max-ranks", "1", line=on_hosts)
    assert "--min-ranks 8 is the fewest ranks the job may go on with after a host is gone, and the launch line " \
           "starts 4" in refused("--min-ranks", "8", line=on_hosts)
    assert "take finite numbers of 0 or more, got --backoff nan" in refused("--backoff", "nan", line=on_hosts)
    here_only = ("mpirun", "-np", "2", "python", "-m", "mpi_train", "--checkpoint-dir", "ck")
    assert "names none to grow from" in refused("--max-ranks", "4", line=here_only)
    assert "--host-discovery-script nowhere.sh: no such file" in refused("--host-discovery-script", "nowhere.sh",
                                                                         line=on_hosts)
