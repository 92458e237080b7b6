"""A rank that dies, raises or hangs ends the whole job quickly, and the MLflow record survives it.

Each case injects one failure through $MPI_TRAIN_FAIL_AT into a real `mpirun -np 2` job that
logs to a real MLflow server, then checks: mpirun exits non-zero within a bound counted from
the moment of the failure, no run is left RUNNING, and metrics logged before the failure are kept.
"""

import re
import time

import pytest
from conftest import client_for, job_runs, mpirun, wait_for

pytestmark = pytest.mark.e2e

QUICK = ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "2", "--timeout",
         "10"]
ENDS_WITHIN_S = 60  # the promise: every rank gone and mpirun returned this soon after the failure


def run_with_fault(mlflow_server, fault: str, experiment: str):
    started = time.time()
    result = mpirun(2, [*QUICK, "--tracking-uri", mlflow_server, "--experiment", experiment, "--run-name", fault],
                    env={"MPI_TRAIN_FAIL_AT": fault}, timeout=240)
    ended = time.time()
    injected = re.search(r"injecting '\w+' on rank \d+ at \w+ \(unix time ([\d.]+)\)", result.stderr)
    assert injected, f"the fault was never injected:\n{result.stdout}\n{result.stderr}"
    assert result.returncode != 0
    return result, ended - float(injected.group(1)), ended - started


def settled(client, experiment: str, run_name: str):
    """The job's runs once nothing is RUNNING (the guard process may record the end a moment after mpirun)."""
    def ended():
        parent, children = job_runs(client, experiment, run_name)
        return all(run.info.status != "RUNNING" for run in (parent, *children)) and (parent, children)

    return wait_for(ended, 30, f"the runs of {run_name} to end (none may stay RUNNING)", every_s=0.5)


def logged_steps(client, run_id: str, key: str, expected: int) -> list[int]:
    """The steps logged for `key`, once `expected` are there (the guard may still be sending)."""
    def logged():
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        return len(steps) >= expected and steps

    return wait_for(logged, 30, f"{expected} logged steps of {key}", every_s=0.5)


# 1:start:refuse: rank 1 alone ends on a refusal, which a job takes for every rank's, while rank 0 waits for it in
# the rendezvous: rank 1 must say it and end the job after --timeout, not wait in MPI_Finalize for ever
@pytest.mark.parametrize("fault", ["1:start:kill", "0:rendezvous:kill", "0:rendezvous:raise", "1:start:refuse"])
def test_a_failure_before_training_ends_the_job_and_leaves_no_run(mlflow_server, fault):
    experiment = f"tests-fault-{fault.replace(':', '-')}"
    result, after_fault_s, _ = run_with_fault(mlflow_server, fault, experiment)
    assert after_fault_s < ENDS_WITHIN_S
    rank = fault.split(":")[0]
    assert re.search(rf"rank {rank}\b", result.stdout + result.stderr)  # mpirun or our guard names the rank
    if fault.endswith("refuse"):
        assert f"error: rank {rank} on " in result.stderr and "an injected refusal on rank 1" in result.stderr
    found = client_for(mlflow_server).get_experiment_by_name(experiment)
    runs = client_for(mlflow_server).search_runs([found.experiment_id]) if found else []
    assert all(run.info.status != "RUNNING" for run in runs)


@pytest.mark.parametrize("fault, last_logged_step", [
    ("1:5:kill", 4),   # mid-epoch: rank 0 is inside the gradient all_reduce when rank 1 dies
    ("1:eval:kill", 16),  # during evaluation, after the epoch's 16 steps
    ("1:5:hang", 4),   # stuck, not dead: only the collective timeout (--timeout 10) can end this
    ("0:5:raise", 4),  # rank 0 itself raises
    ("0:5:kill", 4),   # rank 0, the only one that talks to MLflow, dies: its guard process sends what it left
])
def test_a_failure_during_training_ends_the_job_and_keeps_the_record(mlflow_server, fault, last_logged_step):
    experiment = "tests-fault-training"
    result, after_fault_s, _ = run_with_fault(mlflow_server, fault, experiment)
    assert after_fault_s < ENDS_WITHIN_S
    # the rank left behind says what happened in a paragraph: no C++ stack from asking a store whose server died
    assert "frame #" not in result.stderr, result.stderr
    client = client_for(mlflow_server)
    parent, children = settled(client, experiment, fault)
    assert parent.info.status in ("FAILED", "KILLED")  # KILLED when mpirun's SIGTERM reaches rank 0 first
    steps = logged_steps(client, parent.info.run_id, "learning/loss", len(range(2, last_logged_step + 1, 2)))
    assert steps == list(range(2, last_logged_step + 1, 2)), "metrics logged before the failure were lost"
    failed_rank = fault.split(":")[0]
    if parent.info.status == "FAILED":
        assert parent.data.tags["mpi_train.failed_rank"] == failed_rank
        assert children[int(failed_rank)].info.status == "FAILED"
    said = " ".join(result.stderr.split())
    if fault == "1:5:kill" and "a collective operation failed" in said:  # mpirun may end rank 0 before it notices
        # its sockets closed: gone, not slow, and the paragraph says what kills without a word
        assert re.search(r"Rank 1 on \S+ ended: its process is gone\. .* signal 9 \(Killed\)\.", said), said
        assert "GLHF" not in said and "raise --timeout" not in said
    if fault.endswith("hang"):  # the rank that timed out names the one that never arrived
        assert parent.info.status == "FAILED"
        assert "Behind the others: rank 1 on" in " ".join(result.stderr.split())


@pytest.mark.parametrize("behind, said", [
    ([1], "Behind the others: rank 1 on b; it failed, is stuck, or is too slow there."),
    ([], ("Every rank had reached this step, so one is stuck inside it (stopped, or hung in its own code or a "
          "device call), or failed first and says why above or below.")),  # SIGSTOP after its step was noted
])
def test_a_timed_out_collective_names_who_is_behind_or_says_that_one_is_stuck_inside_the_step(behind, said):
    from types import SimpleNamespace

    from mpi_train.cluster import RankInfo
    from mpi_train.liveness import NoLiveness
    from mpi_train.rankguard import collective_failure

    cluster = SimpleNamespace(info=RankInfo(rank=0, local_rank=0, world_size=2, local_world_size=1, host="a"),
                              hosts=("a", "b"), liveness=NoLiveness(), laggards=lambda: behind)
    error = RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms for recv operation")
    assert f"a collective operation failed (Timed out waiting 20000ms for recv operation). {said}" in \
        collective_failure(cluster, error, 20)
