"""Tracking outages against a real MLflow server that is stopped and started again on the same port and store.

One sequence, because each server start costs 10-30 s: job A trains while the server
stops (it must keep training and spool), is held mid-run while job B starts with no
server (--tracking-spool), job C, without that flag, is refused, and job D, spooling too,
is stopped with SIGTERM; then the server comes back: A re-sends its spool itself, B's and D's
spools are sent by `python -m mpi_train replay` (B's twice: the second finds nothing), and a
job resumed from A's checkpoint links to A's run.
"""

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import MPI_ENV, REPO, MlflowServer, free_port, wait_for

from mpi_train.lab import mpirun as launch
from mpi_train.tracking.spool import OFFLINE_ID_TAG, OFFLINE_PREFIX, Spool, batch_record, server_run_id

pytestmark = pytest.mark.e2e

QUICK = ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "1",
         "--epochs", "10", "--system-metrics-every", "0"]
STEPS_A, STEPS_B, RESUME_AT = 40, 6, 20


class Job:
    """A two-rank training job whose console lines are read as they come, so the test can act at a given step."""

    STEP_LINE = re.compile(r"\bstep\s+(\d+)/")

    def __init__(self, cwd: Path, name: str, *args: str):
        command = ["mpirun", "-np", "2", "--oversubscribe", sys.executable, "-m", "mpi_train", *QUICK,
                   "--experiment", "outage", "--run-name", name, *args]
        self.err_path = cwd / f"{name}.stderr"
        self.cleanup = contextlib.ExitStack()  # stops what is left of the launch and removes its TMPDIR
        with open(self.err_path, "w") as err:
            self.process = self.cleanup.enter_context(launch.launched(
                command, {**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": ""},
                cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True))
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()

    def step(self) -> int:
        """The last step the job printed (0 before the first)."""
        steps = [int(match.group(1)) for line in list(self.lines) if (match := self.STEP_LINE.search(line))]
        return max(steps, default=0)

    def finish(self, timeout_s: float) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) once the job has ended."""
        code = self.process.wait(timeout=timeout_s)
        self.reader.join(10)
        self.cleanup.close()
        return code, "".join(self.lines), self.err_path.read_text()

    def kill(self) -> None:
        self.cleanup.close()


def runs_named(client, experiment: str, name: str):
    """(parent, children by rank) of the job whose parent run is called `name`; (None, []) if there is none."""
    found = client.get_experiment_by_name(experiment)
    parents = client.search_runs([found.experiment_id], f"attributes.run_name = '{name}'") if found else []
    if not parents:
        return None, []
    assert len(parents) == 1, f"{len(parents)} runs called {name}"
    children = client.search_runs([found.experiment_id], f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
    return parents[0], sorted(children, key=lambda run: int(run.data.tags["rank"]))


def has_logged(client, name: str) -> bool:
    parent, _ = runs_named(client, "outage", name)
    return parent is not None and "learning/loss" in parent.data.metrics


def assert_every_step_once(client, run, key: str, steps: int) -> None:
    history = client.get_metric_history(run.info.run_id, key)
    assert sorted(m.step for m in history) == list(range(1, steps + 1)), f"{run.info.run_name}/{key}"


def spooled(folder: Path) -> int:
    """Writes waiting in the spools under `folder`/mlruns/spool."""
    return sum(len(Spool(path)) for path in (folder / "mlruns" / "spool").glob("*.jsonl"))


def spooled_rank0_pid(spool: Path) -> int:
    """Rank 0's pid, from the tags of its child run in a job's spool."""
    [pid] = [record["tags"]["pid"] for record in Spool(spool).records()
             if record["kind"] == "create_run" and record["tags"].get("rank") == "0"]
    return int(pid)


@pytest.fixture(scope="module")
def outage(tmp_path_factory):
    """Run the whole sequence once; the tests below check its outcome.

    Job A's pace is set by pausing its rank 1 (SIGSTOP): rank 0 then waits in a collective
    while its sending thread carries on, so the outage meets A mid-run whatever the machine's speed.
    """
    root = tmp_path_factory.mktemp("outage")
    server = MlflowServer(root)
    from mlflow import MlflowClient  # while the server starts

    uri = server.uri()
    a_dir, b_dir, c_dir, d_dir = (root / name for name in ("a", "b", "c", "d"))
    for folder in (a_dir, b_dir, c_dir, d_dir):
        folder.mkdir()
    job_a = Job(a_dir, "A", "--max-steps", str(STEPS_A), "--tracking-uri", uri,
                "--checkpoint-dir", str(a_dir / "ck"), "--checkpoint-every", str(RESUME_AT),
                "--system-metrics-every", "0.001")  # a host sample at every logged step
    rank1, jobs = None, [job_a]
    try:
        client = MlflowClient(uri)
        wait_for(lambda: job_a.step() >= 1 or job_a.process.poll() is not None, 120, "job A to train")
        _, a_children = runs_named(client, "outage", "A")
        rank1 = int(a_children[1].data.tags["pid"])
        os.kill(rank1, signal.SIGSTOP)
        wait_for(lambda: has_logged(client, "A"), 30, "job A's first steps to reach the server")
        server.stop(signal.SIGHUP)  # as when the server's terminal is closed: the server does not answer after it
        # With the server away: B trains offline by choice; C did not choose to and is refused; D trains offline
        # and is stopped with SIGTERM.
        started = time.monotonic()
        job_c = Job(c_dir, "C", "--max-steps", "4", "--tracking-uri", uri)
        job_b = Job(b_dir, "B", "--max-steps", str(STEPS_B), "--tracking-uri", uri, "--tracking-spool",
                    "--save-model")
        job_d = Job(d_dir, "D", "--tracking-uri", uri, "--tracking-spool")
        jobs += [job_b, job_c, job_d]
        paused_at = job_a.step()
        os.kill(rank1, signal.SIGCONT)  # A trains on with the server away...
        wait_for(lambda: job_a.step() >= paused_at + 3 or job_a.process.poll() is not None, 60, "job A to train on")
        os.kill(rank1, signal.SIGSTOP)  # ...and is held mid-run until the server is back
        wait_for(lambda: spooled(a_dir) >= 3 or job_a.process.poll() is not None, 60, "job A to spool a few writes")
        assert job_a.process.poll() is None and job_a.step() < STEPS_A, "job A stopped when the server went away"
        c_result = job_c.finish(60)
        c_seconds = time.monotonic() - started
        b_result = job_b.finish(120)
        wait_for(lambda: job_d.step() >= 2 or job_d.process.poll() is not None, 120, "job D to train")
        # To rank 0 itself: signalled, mpirun passes SIGTERM on to the ranks but no longer forwards their output.
        [d_spool] = (d_dir / "mlruns" / "spool").glob("*.jsonl")
        os.kill(spooled_rank0_pid(d_spool), signal.SIGTERM)
        d_result = job_d.finish(60)

        server.restart()
        os.kill(rank1, signal.SIGCONT)
        # While A finishes, B's spool is replayed, and a job resumed from A's checkpoint names the run it continues.
        checkpoint = a_dir / "ck" / f"step-{RESUME_AT:08d}.pt"
        wait_for(lambda: checkpoint.exists() or job_a.process.poll() is not None, 60, "job A's checkpoint")
        resumed = Job(a_dir, "A-resumed", "--max-steps", str(STEPS_A), "--tracking-uri", uri, "--resume",
                      str(checkpoint))
        jobs.append(resumed)
        replay_env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": ""}
        replay = subprocess.run([sys.executable, "-m", "mpi_train", "replay", "--tracking-uri", uri], cwd=b_dir,
                                capture_output=True, text=True, timeout=120, env=replay_env, check=False)
        again = subprocess.run([sys.executable, "-m", "mpi_train", "replay", "--tracking-uri", uri], cwd=b_dir,
                               capture_output=True, text=True, timeout=120, env=replay_env, check=False)
        d_replay = subprocess.run([sys.executable, "-m", "mpi_train", "replay", "--tracking-uri", uri], cwd=d_dir,
                                  capture_output=True, text=True, timeout=120, env=replay_env, check=False)
        yield {"server": server, "client": client, "root": root, "a": job_a.finish(120),
               "b": b_result, "c": (*c_result, c_seconds), "replay": replay, "again": again,
               "resumed": resumed.finish(120), "d": d_result, "d_spool": d_spool, "d_replay": d_replay}
    finally:
        if rank1 is not None and job_a.process.poll() is None:
            os.kill(rank1, signal.SIGCONT)
        for job in jobs:
            job.kill()
        server.stop(signal.SIGKILL)  # the command killed: its reaper stops the server


def test_a_job_keeps_training_through_an_outage_and_resends_everything_once(outage):
    code, out, err = outage["a"]
    assert code == 0, out + err
    assert "stopped answering" in err and "still unreachable" not in err
    assert re.search(r"is back; [1-9]\d* spooled write\(s\) sent", err), err  # the job sent its spool itself
    client = outage["client"]
    parent, children = runs_named(client, "outage", "A")
    assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"] * 2
    for key in ("learning/loss", "time/step_s"):
        assert_every_step_once(client, parent, key, STEPS_A)
    for child in children:
        assert_every_step_once(client, child, "rank/loss", STEPS_A)
    assert_every_step_once(client, parent, f"system/{children[0].data.tags['host']}/cpu_utilization_percentage",
                           STEPS_A)
    assert "summary.json" in {item.path for item in client.list_artifacts(parent.info.run_id)}
    assert not list((outage["root"] / "a" / "mlruns" / "spool").glob("*.jsonl"))  # all sent, spool removed


def test_a_job_started_without_a_server_by_choice_is_replayed_once(outage):
    code, out, err = outage["b"]
    assert code == 0, out + err
    assert "--tracking-spool" in err and "python -m mpi_train replay" in err
    assert "trained model spooled with the run's other writes: once `python -m mpi_train replay` has sent" in out, out
    replay, again = outage["replay"], outage["again"]
    assert (replay.returncode == 0 and "sent" in replay.stdout
            and "removed" in replay.stdout), replay.stdout + replay.stderr
    client = outage["client"]
    parent, children = runs_named(client, "outage", "B")
    said = " ".join(replay.stdout.split())  # which run is the job's, where the model it saved loads from
    assert (f"B {parent.info.run_id} (the job's run: its saved model loads as runs:/{parent.info.run_id}/model)"
            in said and f"rank0 {children[0].info.run_id}" in said), said
    # the spool is gone only because it was all sent
    assert again.returncode == 0 and "no spool to send" in again.stdout
    assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"] * 2
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert parent.data.params["sync"] == "allreduce" and {"config.json", "model"} <= artifacts, artifacts
    assert_every_step_once(client, parent, "learning/loss", STEPS_B)
    for child in children:
        assert_every_step_once(client, child, "rank/loss", STEPS_B)
    assert {child.data.tags["mlflow.parentRunId"] for child in children} == {parent.info.run_id}
    local_id = parent.data.tags[OFFLINE_ID_TAG]  # what B's checkpoints would name: a job resumed from one finds the run
    assert (local_id.startswith(OFFLINE_PREFIX)
            and server_run_id(client, parent.info.experiment_id, local_id) == parent.info.run_id)


def test_a_job_stopped_by_sigterm_while_spooling_says_where_its_record_is_and_is_replayed_killed(outage):
    code, out, err = outage["d"]
    assert code != 0 and "SIGTERM received" in err, out + err
    after_signal = " ".join(err.split("SIGTERM received", 1)[1].split())
    assert f"kept in mlruns/spool/{outage['d_spool'].name}" in after_signal, err
    assert "python -m mpi_train replay" in after_signal, err
    replay = outage["d_replay"]
    assert replay.returncode == 0 and "removed" in replay.stdout, replay.stdout + replay.stderr
    parent, children = runs_named(outage["client"], "outage", "D")
    assert parent.info.status == "KILLED" and parent.data.tags["mpi_train.killed_by"] == "SIGTERM"
    assert [child.info.status for child in children] == ["KILLED"] * 2
    assert len(outage["client"].get_metric_history(parent.info.run_id, "learning/loss")) >= 2


def test_an_unreachable_server_at_start_is_refused_quickly_unless_spooling_was_chosen(outage):
    code, out, err, seconds = outage["c"]
    assert code != 0 and seconds < 30
    message = " ".join(err.split())
    assert "No MLflow tracking server answers" in message and "--tracking-spool" in message and "Traceback" not in err
    assert "loss" not in out
    assert runs_named(outage["client"], "outage", "C") == (None, [])  # nothing was created, so nothing is left RUNNING
    assert not (outage["root"] / "c" / "mlruns" / "spool").exists()


def test_a_write_the_server_took_but_never_acknowledged_is_not_sent_twice(outage, tmp_path):
    """The reply to a batch can be lost after the server stored it; the replay must not store it again.

    A write the server refuses (here: to a run that does not exist) is left out without holding back the rest.
    """
    from mlflow.entities import Metric

    client, uri = outage["client"], outage["server"].url
    experiment = client.get_experiment_by_name("outage").experiment_id
    run_id = client.create_run(experiment, run_name="lost-reply").info.run_id
    metrics = [Metric("loss", 1.0 / step, 1_700_000_000_000 + step, step) for step in range(1, 6)]
    client.log_batch(run_id, metrics=metrics[:3], synchronous=True)  # stored; its acknowledgement never written
    spool = Spool(tmp_path / "job.jsonl")
    for record in (batch_record(run_id, metrics[:3]), batch_record("f" * 32, metrics[:1]),
                   batch_record(run_id, metrics[3:])):
        spool.add(record, uri)
    warnings = []
    sent, _ = spool.replay(client, uri, warnings.append)
    assert sent == 2 and not spool.path.exists()
    assert len(warnings) == 1 and "refused" in warnings[0]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(s, 1.0 / s) for s in range(1, 6)]


def test_a_run_creation_the_server_took_but_never_acknowledged_makes_one_run(outage, tmp_path):
    """The reply to a run's creation can be lost too; the replay finds the run by its local id instead of making
    another."""
    from mlflow.entities import Metric

    client, uri = outage["client"], outage["server"].url
    local_id = OFFLINE_PREFIX + "lostcreate"
    create = {"kind": "create_run", "local_id": local_id, "experiment": "outage", "run_name": "lost-create",
              "tags": {OFFLINE_ID_TAG: local_id}, "start_time": 1_700_000_000_000}
    first = Spool(tmp_path / "first.jsonl")
    first.add(create, uri)
    first.replay(client, uri)  # the server made the run; suppose its reply never came back
    spool = Spool(tmp_path / "job.jsonl")
    for record in (create, batch_record(local_id, [Metric("loss", 0.5, 1_700_000_000_001, 1)])):
        spool.add(record, uri)
    sent, _ = spool.replay(client, uri)
    assert sent == 2
    runs = client.search_runs([client.get_experiment_by_name("outage").experiment_id],
                              "attributes.run_name = 'lost-create'")
    assert len(runs) == 1
    assert [(m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, "loss")] == [(1, 0.5)]


def test_the_guard_spools_what_a_dead_rank_0_left_while_the_server_is_away(tmp_path):
    """Rank 0 killed during an outage: its guard adds the metrics it had not handled and the runs' end to the spool."""
    from mlflow.entities import Metric

    from mpi_train.tracking.guard import RunGuard

    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spool = Spool(tmp_path / "job.jsonl")
    spool.add(batch_record("parent", [Metric("loss", 1.0, 1000, 1)]), uri)  # spooled by rank 0 before it died
    guard = RunGuard(uri, "parent", ["child0", "child1"], spool.path)
    guard.keep("parent", [Metric("loss", 1.0, 1000, 1)])
    guard.keep("parent", [Metric("loss", 0.5, 2000, 2)])
    guard.handled(1)  # the first batch was spooled by rank 0; the second never reached its sender
    guard.announce("FAILED", {"mpi_train.failed_rank": "0"}, ["FAILED", "KILLED"])
    guard.process.stdin.close()  # the pipe closes without "done": rank 0 is gone
    assert guard.process.wait(timeout=60) == 0
    records = spool.records()
    assert [(r["kind"], r["run_id"]) for r in records] == [
        ("log_batch", "parent"), ("log_batch", "parent"), ("log_batch", "parent"),
        ("set_terminated", "child0"), ("set_terminated", "child1"), ("set_terminated", "parent")]
    assert [m["step"] for m in records[1]["metrics"]] == [2] and records[2]["tags"] == {"mpi_train.failed_rank": "0"}
    assert [r["status"] for r in records[3:]] == ["FAILED", "KILLED", "FAILED"]
    assert len({r["id"] for r in records}) == len(records)


def test_the_guard_of_a_job_that_recorded_its_own_end_is_gone_when_the_job_is(tmp_path):
    """Told "done" (rank 0 ended the runs itself), the guard leaves before rank 0 does, even one still starting."""
    from mpi_train.tracking.guard import RunGuard

    guard = RunGuard(f"http://127.0.0.1:{free_port()}", "parent", ["child0"], Spool(tmp_path / "job.jsonl").path)
    guard.done()
    assert guard.process.poll() == 0


def test_a_resumed_job_links_to_the_run_it_continues(outage):
    code, out, err = outage["resumed"]
    assert code == 0, out + err
    client = outage["client"]
    original, _ = runs_named(client, "outage", "A")
    parent, _children = runs_named(client, "outage", "A-resumed")
    assert parent.data.tags["resumed_from"] == original.info.run_id
    assert parent.data.tags["resumed_from_step"] == str(RESUME_AT)
    history = client.get_metric_history(parent.info.run_id, "learning/loss")
    assert [m.step for m in history] == list(range(RESUME_AT + 1, STEPS_A + 1))
    before = {m.step: m.value for m in client.get_metric_history(original.info.run_id, "learning/loss")}
    assert [m.value for m in history] == pytest.approx([before[m.step] for m in history], rel=1e-6, abs=0)


def test_the_guard_finishes_a_run_the_job_created_offline_and_sent_itself(outage, tmp_path):
    """Rank 0 dies after its offline runs reached the server: the guard finds them by their local id and ends them."""
    from mlflow.entities import Metric

    from mpi_train.tracking.guard import RunGuard

    client, uri = outage["client"], outage["server"].url
    experiment = client.get_experiment_by_name("outage").experiment_id
    local_id = OFFLINE_PREFIX + "guardcheck"
    run_id = client.create_run(experiment, run_name="sent-offline", tags={OFFLINE_ID_TAG: local_id}).info.run_id
    guard = RunGuard(uri, local_id, [], tmp_path / "job.jsonl", "outage")  # its spool was sent and removed
    guard.keep(local_id, [Metric("loss", 0.25, 3000, 3)])
    guard.announce("KILLED", {"mpi_train.killed_by": "SIGKILL"}, [])
    guard.process.stdin.close()
    assert guard.process.wait(timeout=60) == 0
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["mpi_train.killed_by"] == "SIGKILL"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(3, 0.25)]
