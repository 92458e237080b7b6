"""slurm/train.sbatch on a real Slurm cluster: slurmctld here and one slurmd on each of two test hosts.

scripts/slurmcluster.sh brings the cluster up (installing Slurm and munge with apt-get if they are
missing) on its own test hosts (slm1, slm2 on 10.82.0.0/24) and takes it down on every exit path.
A real MLflow server listens on the hosts' bridge address. Needs root, like the test hosts.
"""

import json
import os
import re
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
WHOLE = [*QUICK, "--max-steps", "16", "--checkpoint-every", "4"]  # 16 steps: one epoch
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


@pytest.fixture(scope="module")
def whole_job(cluster, server, tmp_path_factory):
    """A two-node job of 16 steps with checkpoints, never stopped: its log, summary and runs."""
    tmp = tmp_path_factory.mktemp("slurm_whole")
    out, summary = tmp / "job.out", tmp / "slurm.json"
    submitted = sbatch(cluster, server, out, [*WHOLE, "--checkpoint-dir", str(tmp / "ck"), "--experiment",
                                              "tests-slurm", "--run-name", "slurm-finished", "--summary-json",
                                              str(summary)], "--parsable")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    # asked every half second: sbatch --wait asks after 2, 10 and 42 s, so a job of 12 s waited 30 s for its answer
    deadline = time.monotonic() + 300
    while (ended := _job_state(cluster, job_id)) is None or ended[0] not in ENDED:
        assert time.monotonic() < deadline, "the job did not end:\n" + (out.read_text() if out.exists() else "")
        time.sleep(0.5)
    log = out.read_text() if out.exists() else ""
    assert ended[0] == "COMPLETED", f"the job ended {ended[0]}:\n{log}"
    return {"log": log, "summary": json.loads(summary.read_text()), "tmp": tmp}


def test_a_two_node_job_is_one_run_with_the_losses_of_mpirun(whole_job, server):
    assert "4 rank(s) on 2 host(s) (slm1, slm2)" in whole_job["log"], whole_job["log"]
    client = client_for(server)
    parent, children = job_runs(client, "tests-slurm", "slurm-finished")
    assert parent.info.status == "FINISHED"
    assert parent.data.params["world_size"] == "4"
    assert parent.data.params["hosts"] == "slm1,slm2"
    assert [c.data.tags["host"] for c in children] == ["slm1", "slm1", "slm2", "slm2"]
    assert all(c.info.status == "FINISHED" for c in children)
    under_mpirun = train(4, whole_job["tmp"], *WHOLE, "--checkpoint-dir", str(whole_job["tmp"] / "ck-mpirun"),
                         "--no-tracking", name="mpirun")
    under_slurm = whole_job["summary"]
    assert len(losses(under_slurm)) == 8
    assert losses(under_slurm) == pytest.approx(losses(under_mpirun), rel=1e-6, abs=1e-7)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_scancel_ends_every_rank_and_the_run_is_killed_with_its_metrics(cluster, server, tmp_path):
    out = tmp_path / "job.out"
    # two-level local SGD (each node's ranks average every step, the nodes every 2): model averaging under Slurm
    submitted = sbatch(cluster, server, out, [*QUICK, "--epochs", "1000", "--experiment", "tests-slurm",
                                              "--run-name", "slurm-cancelled", "--sync", "localsgd", "--period", "2",
                                              "--host-period", "1"], "--parsable")
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
    assert parent.data.params["sync"] == "localsgd" and parent.data.params["host_period"] == "1"
    drift = client.get_metric_history(parent.info.run_id, "learning/drift")  # logged with every loss
    assert [m.step for m in drift][:2] == [2, 4] and all(m.value >= 0 for m in drift), drift


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def _nodes_idle(cluster: dict) -> bool:
    """Every node idle: no job on it, nothing left completing."""
    states = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=cluster, capture_output=True, text=True,
                            timeout=30, check=False).stdout.split()
    return bool(states) and all(state == "idle" for state in states)


def _job_state(cluster: dict, job_id: str) -> tuple[str, int] | None:
    """The job's state and how often it was requeued, as slurmctld has them (it keeps an ended job a few minutes);
    None when it did not answer (busy: ask again), so a slow answer is never taken for an ended job."""
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=cluster, capture_output=True, text=True,
                           timeout=30, check=False)
    state, restarts = re.search(r"\bJobState=(\S+)", shown.stdout), re.search(r"\bRestarts=(\d+)", shown.stdout)
    return (state.group(1), int(restarts.group(1))) if shown.returncode == 0 and state and restarts else None


def test_a_signalled_job_checkpoints_is_requeued_and_finishes_in_one_run(cluster, server, whole_job, tmp_path):
    """Slurm's USR1 (as --signal sends it before the time limit): checkpoint, exit 75, requeue, resume, one run."""
    job = [*WHOLE, "--experiment", "tests-slurm"]
    out, checkpoints = tmp_path / "job.out", tmp_path / "ck"
    submitted = sbatch(cluster, server, out, [*job, "--checkpoint-dir", str(checkpoints), "--run-name",
                                              "slurm-requeued", "--summary-json", str(tmp_path / "requeued.json")],
                       "--parsable")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 180
        while not (checkpoints / "step-00000004.pt").exists():  # training, with a checkpoint behind it
            assert time.monotonic() < deadline, "no checkpoint:\n" + (out.read_text() if out.exists() else "")
            time.sleep(0.5)
        subprocess.run(["scancel", "-s", "USR1", job_id], env=cluster, check=True, timeout=30)
        deadline = time.monotonic() + 120
        while "requeueing job" not in (out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline, "never requeued:\n" + (out.read_text() if out.exists() else "")
            time.sleep(0.5)
        requeued = time.monotonic()
        while _job_state(cluster, job_id) != ("PENDING", 1):
            assert time.monotonic() < deadline, f"requeued job not pending: {_job_state(cluster, job_id)}"
            time.sleep(0.5)
        # Slurm holds a requeued job back for a while (BeginTime), which leaves the nodes time to finish cleaning up
        # after the first start; let it start as soon as they have
        while not _nodes_idle(cluster):
            assert time.monotonic() < deadline, "the nodes never came back idle after the requeue"
            time.sleep(0.5)
        # slurmd revoked the first start's credential at the requeue, to the second: a start in that same second is
        # refused ("Job credential revoked") and the job fails; Slurm's own hold (BeginTime) is far longer
        time.sleep(max(0.0, requeued + 2.0 - time.monotonic()))
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=cluster, check=True,
                       timeout=30)
        deadline = time.monotonic() + 240
        while (ended := _job_state(cluster, job_id)) is None or ended[0] not in ENDED:
            assert time.monotonic() < deadline, "the requeued job did not end:\n" + out.read_text()
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job_id], env=cluster, timeout=30, check=False)
    log = out.read_text()
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=cluster, capture_output=True, text=True,
                           timeout=30, check=False).stdout
    assert ended == ("COMPLETED", 1), f"{ended}:\n{shown}\n{log}"
    assert "SIGUSR1 received: checkpointed at step" in log and "(start 1)" in log, log
    requeued, whole = json.loads((tmp_path / "requeued.json").read_text()), whole_job["summary"]
    stopped_at = requeued["resumed_from"]["step"]
    assert 4 <= stopped_at < 16
    assert requeued["weights_sha256"] == whole["weights_sha256"]
    client = client_for(server)
    parent, children = job_runs(client, "tests-slurm", "slurm-requeued")
    assert parent.info.status == "FINISHED" and all(c.info.status == "FINISHED" for c in children)
    assert parent.data.tags["mpi_train.attempts"] == "2"
    assert parent.data.tags["mpi_train.restart.1"].startswith("attempt 1 ended KILLED (SIGUSR1 received")
    steps = [m.step for m in client.get_metric_history(parent.info.run_id, "learning/loss")]
    assert sorted(steps) == list(range(2, 17, 2))  # each logged step once
