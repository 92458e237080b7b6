"""Tracking outages against a real MLflow server that is stopped and started again on the same port and store.

One sequence, because each server start costs 15-60 s: job A trains while the server
stops (it must keep training and spool), is paused while job B starts with no server
(--tracking-spool) and a job without that flag is refused, then the server comes back:
A re-sends its spool itself, B's spool is sent by `python -m mpi_train.replay`.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import MPI_ENV, REPO, free_port, mpirun
from mpi_train.spool import Spool, batch_record

pytestmark = pytest.mark.e2e

QUICK = ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "1",
         "--epochs", "10", "--system-metrics-every", "0"]
STEPS_A, STEPS_B, RESUME_AT = 40, 6, 20


class RestartableServer:
    """`python -m mpi_train.server` on a fixed port and store, so it can go away and come back as the same server."""

    def __init__(self, root: Path):
        self.root, self.port, self.process = root, free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.root / "server.log", "a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mpi_train.server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--root", str(self.root / "store")],
            cwd=self.root, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
        wait_for(self.answers, 150, "the mlflow server to start:\n" + (self.root / "server.log").read_text()[-2000:])

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # mpi_train.server stops mlflow and its workers
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        assert not self.answers()


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def start_job(cwd: Path, *args: str) -> subprocess.Popen:
    command = ["mpirun", "-np", "2", "--oversubscribe", sys.executable, "-m", "mpi_train", *QUICK, *args]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": ""},
                            start_new_session=True)  # its own process group, so it can be paused as a whole


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
    return parent is not None and "loss" in parent.data.metrics


def assert_every_step_once(client, run, key: str, steps: int) -> None:
    history = client.get_metric_history(run.info.run_id, key)
    assert sorted(m.step for m in history) == list(range(1, steps + 1)), f"{run.info.run_name}/{key}"


@pytest.fixture(scope="module")
def outage(tmp_path_factory):
    """Run the whole sequence once; the tests below check its outcome."""
    root = tmp_path_factory.mktemp("outage")
    server = RestartableServer(root)
    server.start()
    a_dir, b_dir, c_dir = (root / name for name in ("a", "b", "c"))
    for folder in (a_dir, b_dir, c_dir):
        folder.mkdir()
    job_a = start_job(a_dir, "--max-steps", str(STEPS_A), "--tracking-uri", server.uri, "--experiment", "outage", "--run-name", "A",
                      "--checkpoint-dir", str(a_dir / "ck"), "--checkpoint-every", str(RESUME_AT))
    try:
        from mlflow import MlflowClient

        client = MlflowClient(server.uri)
        wait_for(lambda: has_logged(client, "A"), 120, "job A to log its first steps")
        server.stop()
        spool_dir = a_dir / "mlruns" / "spool"
        wait_for(lambda: any(spool_dir.glob("*.jsonl")) and len(Spool(next(spool_dir.glob("*.jsonl")))) >= 3, 60,
                 "job A to spool a few writes")
        assert job_a.poll() is None, "job A stopped when the server went away"
        os.killpg(job_a.pid, signal.SIGSTOP)  # hold A mid-run until the server is back

        # With the server away: B trains offline by choice; C did not choose to and is refused.
        started = time.monotonic()
        job_c = start_job(c_dir, "--max-steps", "4", "--tracking-uri", server.uri, "--experiment", "outage", "--run-name", "C")
        job_b = start_job(b_dir, "--max-steps", str(STEPS_B), "--tracking-uri", server.uri, "--experiment", "outage",
                          "--run-name", "B", "--tracking-spool")
        c_out, c_err = job_c.communicate(timeout=60)
        c_seconds = time.monotonic() - started
        b_out, b_err = job_b.communicate(timeout=120)

        server.start()
        os.killpg(job_a.pid, signal.SIGCONT)
        a_out, a_err = job_a.communicate(timeout=120)
        replay = subprocess.run([sys.executable, "-m", "mpi_train.replay", "--tracking-uri", server.uri], cwd=b_dir,
                                capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        again = subprocess.run([sys.executable, "-m", "mpi_train.replay", "--tracking-uri", server.uri], cwd=b_dir,
                               capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        # A job resumed from A's checkpoint at step 20 names the run it continues.
        resumed = mpirun(2, [*QUICK, "--max-steps", str(STEPS_A), "--tracking-uri", server.uri, "--experiment", "outage",
                             "--run-name", "A-resumed", "--resume", str(a_dir / "ck" / f"step-{RESUME_AT:08d}.pt")],
                         cwd=a_dir, env={"MLFLOW_TRACKING_URI": ""})
        yield {"server": server, "client": client, "root": root, "a": (job_a.returncode, a_out, a_err),
               "b": (job_b.returncode, b_out, b_err), "c": (job_c.returncode, c_out, c_err, c_seconds),
               "replay": replay, "again": again, "resumed": resumed}
    finally:
        if job_a.poll() is None:
            os.killpg(job_a.pid, signal.SIGCONT)
            os.killpg(job_a.pid, signal.SIGKILL)
            job_a.wait()
        server.stop()


def test_a_job_keeps_training_through_an_outage_and_resends_everything_once(outage):
    code, out, err = outage["a"]
    assert code == 0, out + err
    assert "stopped answering" in err and "is back" in err and "still unreachable" not in err
    client = outage["client"]
    parent, children = runs_named(client, "outage", "A")
    assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"] * 2
    for key in ("loss", "step_time_s"):
        assert_every_step_once(client, parent, key, STEPS_A)
    for child in children:
        assert_every_step_once(client, child, "loss", STEPS_A)
    assert "summary.json" in {item.path for item in client.list_artifacts(parent.info.run_id)}
    assert not list((outage["root"] / "a" / "mlruns" / "spool").glob("*.jsonl"))  # all sent, spool removed


def test_a_job_started_without_a_server_by_choice_is_replayed_once(outage):
    code, out, err = outage["b"]
    assert code == 0, out + err
    assert "--tracking-spool" in err and "python -m mpi_train.replay" in err
    replay, again = outage["replay"], outage["again"]
    assert replay.returncode == 0 and "sent" in replay.stdout and "removed" in replay.stdout, replay.stdout + replay.stderr
    assert again.returncode == 0 and "no spool to send" in again.stdout  # the spool is gone only because it was all sent
    client = outage["client"]
    parent, children = runs_named(client, "outage", "B")
    assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"] * 2
    assert parent.data.params["sync"] == "allreduce" and "config.json" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert_every_step_once(client, parent, "loss", STEPS_B)
    for child in children:
        assert_every_step_once(client, child, "loss", STEPS_B)


def test_an_unreachable_server_at_start_is_refused_quickly_unless_spooling_was_chosen(outage):
    code, out, err, seconds = outage["c"]
    assert code != 0 and seconds < 30
    message = " ".join(err.split())
    assert "No MLflow tracking server answers" in message and "--tracking-spool" in message and "Traceback" not in err
    assert "loss" not in out
    assert runs_named(outage["client"], "outage", "C") == (None, [])  # nothing was created, so nothing is left RUNNING
    assert not (outage["root"] / "c" / "mlruns" / "spool").exists()


def test_a_write_the_server_took_but_never_acknowledged_is_not_sent_twice(outage, tmp_path):
    """The reply to a batch can be lost after the server stored it; the replay must not store it again."""
    from mlflow.entities import Metric

    client = outage["client"]
    experiment = client.get_experiment_by_name("outage").experiment_id
    run_id = client.create_run(experiment, run_name="lost-reply").info.run_id
    metrics = [Metric("loss", 1.0 / step, 1_700_000_000_000 + step, step) for step in range(1, 6)]
    client.log_batch(run_id, metrics=metrics[:3], synchronous=True)  # stored; its acknowledgement never written
    spool = Spool(tmp_path / "job.jsonl")
    for record in (batch_record(run_id, metrics[:3]), batch_record(run_id, metrics[3:])):
        spool.append({"id": f"record-{len(spool.records())}", "uri": outage["server"].uri, **record})
    sent, _ = spool.replay(client)
    assert sent == 2 and not spool.path.exists()
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(s, 1.0 / s) for s in range(1, 6)]


def test_a_resumed_job_links_to_the_run_it_continues(outage):
    resumed = outage["resumed"]
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    client = outage["client"]
    original, _ = runs_named(client, "outage", "A")
    parent, children = runs_named(client, "outage", "A-resumed")
    assert parent.data.tags["resumed_from"] == original.info.run_id
    assert parent.data.tags["resumed_from_step"] == str(RESUME_AT)
    history = client.get_metric_history(parent.info.run_id, "loss")
    assert [m.step for m in history] == list(range(RESUME_AT + 1, STEPS_A + 1))
    before = {m.step: m.value for m in client.get_metric_history(original.info.run_id, "loss")}
    assert [m.value for m in history] == pytest.approx([before[m.step] for m in history], rel=1e-6, abs=0)
