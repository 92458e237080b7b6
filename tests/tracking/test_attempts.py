"""The attempts of a job under --resume auto in one MLflow run: the restart tags, and the rank runs a job that shrinks
and grows back leaves, reopens and opens, against a real SQLite store."""

import json

import pytest

from mpi_train.config import TrainConfig
from mpi_train.tracking.attempts import (
    JOINED_TAG,
    LEFT_TAG,
    REJOINED_TAG,
    RELAUNCH_FILE,
    RUN_FILE,
    AttemptRuns,
    Relaunch,
    taken_relaunch,
)
from mpi_train.tracking.runs import MlflowTracker
from mpi_train.tracking.store import Connection, mlflow_client

HOSTS = ("10.88.0.2", "10.88.0.3")  # two hosts of two ranks each, as the hostfile names them
REQUEUED = ("SIGUSR1 received: checkpointed at step {step} and stopped for requeue (exit status 75); --resume auto "
            "continues from there")  # the tag an attempt stopped by SIGUSR1 ends with (loop/after_step.py)


class Attempt(AttemptRuns):
    """Rank 0's tracker as far as an attempt's runs go: MlflowTracker's own calls that open a rank's run and that
    find and reopen the runs of the attempt before, in the order its constructor makes them."""

    _create_child = MlflowTracker._create_child

    def __init__(self, connection: Connection, checkpoint_dir, resumed_from: dict | None, ranks: int, pid: int):
        self.client, self.config, self.attempt = connection.client, TrainConfig(), 1
        self.resumed_step = resumed_from["step"] if resumed_from else 0
        who = [{"rank": rank, "local_rank": rank % 2, "host": HOSTS[rank // 2 % 2], "pid": pid + rank}
               for rank in range(ranks)]
        continued = self._previous_attempt(connection, str(checkpoint_dir), resumed_from, ranks)
        self.parent_id, self.child_ids = continued or (None, [])
        if continued:
            self._restart_runs(connection, who, {})
            return
        self.parent_id = self.client.create_run(connection.experiment_id, run_name="grow", tags={
            "mpi_train.role": "job", "mpi_train.attempts": "1", "mpi_train.world_size": str(ranks)}).info.run_id
        self.child_ids = [self._create_child(connection, rank) for rank in who]

    def end(self, status: str, tags: dict, failed_ranks: tuple[int, ...] = ()) -> None:
        """As MlflowTracker.end records an attempt's end: the parent's tags, then each run's status."""
        for key, value in tags.items():
            self.client.set_tag(self.parent_id, key, value)
        for rank, child_id in enumerate(self.child_ids):
            self.client.set_terminated(child_id, status if status != "FAILED" or rank in failed_ranks else "KILLED")
        self.client.set_terminated(self.parent_id, status)

    def resumed_here(self, step: int) -> dict:
        """The checkpoint this attempt wrote at `step`, as the next attempt's job reads it (JobInfo.resumed_from)."""
        return {"step": step, "run_id": self.parent_id, "world_size": len(self.child_ids), "checkpoint": "step.pt"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real MLflow store in a SQLite file (what a job without --tracking-uri writes to)."""
    folder = tmp_path_factory.mktemp("mlruns")
    return mlflow_client(f"sqlite:///{folder / 'mlflow.db'}")


def connected(store, name: str) -> Connection:
    return Connection(client=store, uri="sqlite:///", experiment_id=store.create_experiment(name))


def rank_runs(store, connection: Connection, parent_id: str) -> dict:
    runs = store.search_runs([connection.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    return {int(run.data.tags["rank"]): run for run in runs}


def supervisor_relaunches(checkpoints, reason: str) -> None:
    """What the supervisor writes beside the checkpoints before it relaunches a job it stopped to grow."""
    (checkpoints / RELAUNCH_FILE).write_text(json.dumps({"reason": reason, "grow": True}))


def test_a_job_that_shrinks_and_grows_back_reopens_the_runs_of_the_ranks_that_return(store, tmp_path):
    connection = connected(store, "shrink-then-grow")
    first = Attempt(connection, tmp_path, None, ranks=4, pid=100)
    first.end("FAILED", {"mpi_train.unreachable_hosts": HOSTS[1], "mpi_train.unreachable_ranks": "2,3",
                         "mpi_train.failed_rank": "2", "mpi_train.failed_host": HOSTS[1],
                         "mpi_train.error": "Unreachable"}, failed_ranks=(2, 3))
    ids = list(first.child_ids)

    # the host is gone: two ranks go on from step 4, with no word from the supervisor (byte for byte as ever)
    second = Attempt(connection, tmp_path, first.resumed_here(4), ranks=2, pid=200)
    assert second.parent_id == first.parent_id and second.child_ids == ids[:2]
    parent = store.get_run(first.parent_id)
    assert parent.data.tags["mpi_train.restart.1"] == (f"attempt 1 ended FAILED (unreachable: host(s) {HOSTS[1]}, "
                                                       f"ranks 2,3); attempt 2 resumed from step 4 on 2 ranks (was 4)")
    assert "mpi_train.unreachable_hosts" not in parent.data.tags
    runs = rank_runs(store, connection, first.parent_id)
    assert [runs[rank].data.tags[LEFT_TAG] for rank in (2, 3)] == [
        "the job went on without this rank from step 4 (attempt 2, on 2 ranks)"] * 2
    assert [runs[rank].info.status for rank in range(4)] == ["RUNNING", "RUNNING", "FAILED", "FAILED"]

    # the host answers again: the supervisor stops the job at step 8 (SIGUSR1) and relaunches it on 4 ranks
    second.end("KILLED", {"mpi_train.requeued": REQUEUED.format(step=8)})
    supervisor_relaunches(tmp_path, f"host(s) {HOSTS[1]} returned")
    third = Attempt(connection, tmp_path, second.resumed_here(8), ranks=4, pid=300)
    assert third.child_ids == ids  # the ranks back reopen their own runs: no new run
    assert not (tmp_path / RELAUNCH_FILE).exists()
    parent = store.get_run(first.parent_id)
    assert parent.info.status == "RUNNING" and parent.data.tags["mpi_train.world_size"] == "4"
    assert parent.data.tags["mpi_train.attempts"] == "3" and "mpi_train.requeued" not in parent.data.tags
    assert parent.data.tags["mpi_train.restart.2"] == (
        f"attempt 2 ended KILLED (stopped by the supervisor at step 8 to grow); attempt 3 resumed from step 8 on 4 "
        f"ranks (was 2): host(s) {HOSTS[1]} returned")
    runs = rank_runs(store, connection, first.parent_id)
    assert sorted(runs) == [0, 1, 2, 3] and [runs[rank].info.status for rank in range(4)] == ["RUNNING"] * 4
    assert [runs[rank].data.tags["pid"] for rank in range(4)] == ["300", "301", "302", "303"]
    assert [runs[rank].data.tags["host"] for rank in range(4)] == [HOSTS[0], HOSTS[0], HOSTS[1], HOSTS[1]]
    assert [LEFT_TAG in runs[rank].data.tags for rank in range(4)] == [False] * 4
    assert [runs[rank].data.tags.get(REJOINED_TAG) for rank in range(4)] == [
        None, None, "rejoined from step 8 (attempt 3)", "rejoined from step 8 (attempt 3)"]

    # a later requeue the supervisor did not cause (Slurm's) does not repeat its reason
    third.end("KILLED", {"mpi_train.requeued": REQUEUED.format(step=12)})
    fourth = Attempt(connection, tmp_path, third.resumed_here(12), ranks=4, pid=400)
    assert fourth.child_ids == ids
    assert store.get_run(first.parent_id).data.tags["mpi_train.restart.3"] == (
        f"attempt 3 ended KILLED ({REQUEUED.format(step=12)}); attempt 4 resumed from step 12")


def test_a_rank_new_to_the_job_opens_a_run_tagged_with_the_attempt_it_joined(store, tmp_path):
    connection = connected(store, "new-host")
    first = Attempt(connection, tmp_path, None, ranks=2, pid=100)
    first.end("KILLED", {"mpi_train.requeued": REQUEUED.format(step=6)})
    supervisor_relaunches(tmp_path, "new host(s) 10.88.0.4 joined")
    second = Attempt(connection, tmp_path, first.resumed_here(6), ranks=3, pid=200)
    assert second.child_ids[:2] == first.child_ids and len(set(second.child_ids)) == 3
    assert store.get_run(first.parent_id).data.tags["mpi_train.restart.1"] == (
        "attempt 1 ended KILLED (stopped by the supervisor at step 6 to grow); attempt 2 resumed from step 6 on 3 "
        "ranks (was 2): new host(s) 10.88.0.4 joined")
    runs = rank_runs(store, connection, first.parent_id)
    assert runs[2].info.run_id == second.child_ids[2] and runs[2].info.status == "RUNNING"
    assert runs[2].data.tags[JOINED_TAG] == "attempt 2, from step 6" and runs[2].data.tags["pid"] == "202"
    assert [JOINED_TAG in runs[rank].data.tags for rank in (0, 1)] == [False, False]


def test_a_job_that_shrinks_before_its_first_checkpoint_starts_again_in_the_same_run(store, tmp_path):
    connection = connected(store, "shrink-before-checkpoint")
    first = Attempt(connection, tmp_path, None, ranks=4, pid=100)
    (tmp_path / RUN_FILE).write_text(json.dumps({"run_id": first.parent_id}))  # as the job notes it
    first.end("FAILED", {"mpi_train.unreachable_hosts": HOSTS[1], "mpi_train.unreachable_ranks": "2,3"},
              failed_ranks=(2, 3))
    second = Attempt(connection, tmp_path, None, ranks=2, pid=200)  # nothing to resume: step 0 on the host left
    assert second.parent_id == first.parent_id and second.child_ids == first.child_ids[:2]
    assert store.get_run(first.parent_id).data.tags["mpi_train.restart.1"] == (
        f"attempt 1 ended FAILED (unreachable: host(s) {HOSTS[1]}, ranks 2,3); attempt 2 started again (no "
        f"checkpoint yet) on 2 ranks (was 4)")
    runs = rank_runs(store, connection, first.parent_id)
    assert runs[3].data.tags[LEFT_TAG] == "the job went on without this rank from step 0 (attempt 2, on 2 ranks)"


def test_a_grow_that_failed_on_its_way_keeps_the_failure_as_its_cause(store, tmp_path):
    connection = connected(store, "grow-failed")
    first = Attempt(connection, tmp_path, None, ranks=2, pid=100)
    first.end("FAILED", {"mpi_train.failed_rank": "1", "mpi_train.failed_host": HOSTS[0],
                         "mpi_train.error": "RuntimeError: boom"}, failed_ranks=(1,))
    supervisor_relaunches(tmp_path, f"host(s) {HOSTS[1]} returned")
    Attempt(connection, tmp_path, first.resumed_here(5), ranks=4, pid=200)
    assert store.get_run(first.parent_id).data.tags["mpi_train.restart.1"] == (
        f"attempt 1 ended FAILED (rank 1 on {HOSTS[0]}: RuntimeError: boom); attempt 2 resumed from step 5 on 4 "
        f"ranks (was 2): host(s) {HOSTS[1]} returned")


def test_the_supervisors_note_is_read_once(tmp_path):
    assert taken_relaunch(str(tmp_path)) is None
    (tmp_path / RELAUNCH_FILE).write_text('{"reason": " host(s) h3 returned\\n", "grow": true}')
    assert taken_relaunch(str(tmp_path)) == Relaunch(reason="host(s) h3 returned", grow=True)
    assert not (tmp_path / RELAUNCH_FILE).exists() and taken_relaunch(str(tmp_path)) is None
    (tmp_path / RELAUNCH_FILE).write_text('{"reason": "the job failed"}')
    assert taken_relaunch(str(tmp_path)) == Relaunch(reason="the job failed", grow=False)


@pytest.mark.parametrize("text", ['{"reason": "host(s) h3 ret', "[1, 2]", '{"grow": true}', '{"reason": ""}',
                                  '{"reason": "h3 returned", "grow": "yes"}', "\udcff"])
def test_a_malformed_note_is_removed_and_named_and_the_job_goes_on(tmp_path, capsys, text):
    (tmp_path / RELAUNCH_FILE).write_bytes(text.encode(errors="surrogateescape"))
    assert taken_relaunch(str(tmp_path)) is None
    assert not (tmp_path / RELAUNCH_FILE).exists()
    warning = capsys.readouterr().err
    assert f"{tmp_path / RELAUNCH_FILE} could not be read" in warning and "recorded without its reason" in warning
    assert warning.count("\n") == 1  # one paragraph, no traceback
