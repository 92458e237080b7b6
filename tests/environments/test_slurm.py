"""slurm/train.sbatch on a real Slurm cluster: slurmctld here and one slurmd on each of two test hosts.

scripts/slurmcluster.sh brings the cluster up (installing Slurm and munge with apt-get if they are
missing) on its own test hosts (slm1, slm2 on 10.82.0.0/24) and takes it down on every exit path.
A real MLflow server listens on the hosts' bridge address. Needs root, like the test hosts.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, MlflowServer, client_for, job_runs, losses, train, why_no_namespaces

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # the first test also waits for the cluster and the server

PREFIX, SUBNET = "slm", "10.82.0"  # apart from tests/test_testhosts.py (mpitest, 10.78.0) and by-hand hosts
BRIDGE_ADDRESS = f"{SUBNET}.1"
QUICK = ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "2", "--sync",
         "allreduce"]
ENDS_WITHIN_S = 60

if why_no_namespaces(PREFIX):  # the Slurm cluster runs its nodes in network namespaces
    pytest.skip(why_no_namespaces(PREFIX), allow_module_level=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster's environment for Slurm's commands (SLURM_CONF), from `up` to `down`, whatever happens."""
    state = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "TESTHOSTS_PREFIX": PREFIX, "TESTHOSTS_SUBNET": SUBNET,
           "TESTHOSTS_HOSTFILE": str(state / "hostfile"), "SLURMCLUSTER_DIR": str(state / "cluster"),
           "SLURMCLUSTER_CPUS": "2"}
    script = REPO / "scripts" / "slurmcluster.sh"
    try:
        up = subprocess.run([str(script), "up", "2"], env=env, capture_output=True, text=True, timeout=900, check=False)
        assert up.returncode == 0, f"slurmcluster.sh up failed:\n{up.stdout}\n{up.stderr}"
        yield {**env, "SLURM_CONF": str(state / "cluster" / "slurm.conf")}
    finally:
        down = subprocess.run([str(script), "down"], env=env, capture_output=True, text=True, timeout=120, check=False)
        assert down.returncode == 0, down.stderr
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        assert not any(line.startswith(PREFIX) for line in left.splitlines()), f"namespaces left: {left}"
        assert not (state / "cluster").exists()


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory):
    """A tracking server on the bridge, the address the nodes reach this machine at."""
    tracking = MlflowServer(tmp_path_factory.mktemp("slurm_mlflow"), host=BRIDGE_ADDRESS)
    try:
        yield tracking.uri()
    finally:
        tracking.stop()


def job_env(cluster: dict, server: str) -> dict:
    """What a user's shell holds when they submit: the tracking URI, the Python and the repository."""
    return {**cluster, "MLFLOW_TRACKING_URI": server, "MPI_TRAIN_PYTHON": sys.executable, "MPI_TRAIN_REPO": str(REPO),
            "PYTHONUNBUFFERED": "1"}


def sbatch(cluster: dict, server: str, out: Path, args: list[str], *extra: str, timeout: float = 300):
    return subprocess.run(["sbatch", *extra, "-N", "2", "--ntasks-per-node", "2", "-o", str(out),
                           str(REPO / "slurm" / "train.sbatch"), *args],
                          env=job_env(cluster, server), cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_a_two_node_job_is_one_run_with_the_losses_of_mpirun(cluster, server, tmp_path):
    summary = tmp_path / "slurm.json"
    out = tmp_path / "job.out"
    result = sbatch(cluster, server, out, [*QUICK, "--max-steps", "6", "--experiment", "tests-slurm",
                                           "--run-name", "slurm-finished", "--summary-json", str(summary)], "--wait")
    log = out.read_text() if out.exists() else ""
    assert result.returncode == 0, f"sbatch --wait failed:\n{result.stdout}\n{result.stderr}\n{log}"
    assert "4 rank(s) on 2 host(s) (slm1, slm2)" in log, log
    client = client_for(server)
    parent, children = job_runs(client, "tests-slurm", "slurm-finished")
    assert parent.info.status == "FINISHED"
    assert parent.data.params["world_size"] == "4"
    assert parent.data.params["hosts"] == "slm1,slm2"
    assert [c.data.tags["host"] for c in children] == ["slm1", "slm1", "slm2", "slm2"]
    assert all(c.info.status == "FINISHED" for c in children)
    under_mpirun = train(4, tmp_path, *QUICK, "--max-steps", "6", "--no-tracking", name="mpirun")
    under_slurm = json.loads(summary.read_text())
    assert len(losses(under_slurm)) == 3
    assert losses(under_slurm) == pytest.approx(losses(under_mpirun), rel=1e-6, abs=1e-7)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_scancel_ends_every_rank_and_the_run_is_killed_with_its_metrics(cluster, server, tmp_path):
    out = tmp_path / "job.out"
    submitted = sbatch(cluster, server, out, [*QUICK, "--epochs", "1000", "--experiment", "tests-slurm",
                                              "--run-name", "slurm-cancelled"], "--parsable")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    client = client_for(server)
    try:
        deadline = time.monotonic() + 180
        while True:  # running and logging: a loss at step 4 or later is in MLflow
            experiment = client.get_experiment_by_name("tests-slurm")
            runs = (client.search_runs([experiment.experiment_id], "attributes.run_name = 'slurm-cancelled'")
                    if experiment else [])
            if runs and any(m.step >= 4 for m in client.get_metric_history(runs[0].info.run_id, "learning/loss")):
                break
            assert time.monotonic() < deadline, ("the job never logged a loss:\n"
                                                 + (out.read_text() if out.exists() else ""))
            time.sleep(1)
        parent, children = job_runs(client, "tests-slurm", "slurm-cancelled")
        pids = [int(c.data.tags["pid"]) for c in children]
        assert len(pids) == 4 and all(_alive(pid) for pid in pids)
        cancelled = time.monotonic()
        subprocess.run(["scancel", job_id], env=cluster, check=True, timeout=30)
        while any(_alive(pid) for pid in pids):
            assert time.monotonic() - cancelled < ENDS_WITHIN_S, f"ranks still running {ENDS_WITHIN_S} s after scancel"
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job_id], env=cluster, timeout=30, check=False)
    deadline = time.monotonic() + 30
    while True:  # rank 0 or its guard process records the end
        parent, children = job_runs(client, "tests-slurm", "slurm-cancelled")
        if parent.info.status != "RUNNING" and all(c.info.status != "RUNNING" for c in children):
            break
        assert time.monotonic() < deadline, "run left RUNNING after scancel"
        time.sleep(0.5)
    assert parent.info.status == "KILLED"
    assert parent.data.tags.get("mpi_train.killed_by") == "SIGTERM"
    steps = [m.step for m in client.get_metric_history(parent.info.run_id, "learning/loss")]
    assert steps and steps[:2] == [2, 4], "the metrics logged before scancel were lost"
