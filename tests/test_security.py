"""Let no one in: an authenticated tracking server, no pickles over the network, listeners only where the job talks.

Real parts: the rendezvous store is a real TCPStore, the server a real `mlflow server` with its authentication
app, the jobs real mpirun jobs."""

from __future__ import annotations

import datetime
import json
import os
import pickle
import re
import socket
import time
import urllib.error
import urllib.request
import uuid

import pytest
from conftest import LiveJob, MlflowServer, artifact_texts, client_for, free_port, job_runs, listening_on, mpirun

from mpi_train.analysis.compare import main as compare_main
from mpi_train.environments.store import StoreChannel
from mpi_train.errors import UserError
from mpi_train.tracking.replay import main as replay_main
from mpi_train.tracking.runs import checked_failure
from mpi_train.tracking.server import main as server_main
from mpi_train.tracking.spool import Spool
from mpi_train.wire import decode, encode

QUICK = ["--dataset", "synthetic", "--synthetic-size", "256", "--batch-size", "32", "--max-steps", "4", "--log-every",
         "2", "--system-metrics-every", "0"]


class Planted:
    """What a forged pickle would run when read: it creates a file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_values_travel_as_plain_data_and_a_forged_pickle_is_refused_without_running(tmp_path):
    planted = tmp_path / "planted"
    assert decode(encode({"rank": 1, "hosts": ["a", "b"]}), "x") == {"rank": 1, "hosts": ["a", "b"]}
    import torch

    state = decode(encode({"rng": torch.arange(3), 7: (1.5, None)}), "x")  # tensors, non-string keys: torch's format
    assert torch.equal(state["rng"], torch.arange(3)) and state[7] == (1.5, None)
    for forged in (pickle.dumps(Planted(str(planted))), b"T" + pickle.dumps(Planted(str(planted))), b"J{not json"):
        with pytest.raises(UserError, match="under the spot is garbled or forged"):
            decode(forged, "the spot")
    assert not planted.exists()


def test_a_forged_value_under_a_store_key_is_refused_naming_the_key(tmp_path):
    """Rank 1 of a torchrun-like job reads rank 0's part of an allgather from a real TCPStore; someone set that key."""
    from torch.distributed import TCPStore

    planted = tmp_path / "planted"
    store = TCPStore("127.0.0.1", free_port(), 1, is_master=True, timeout=datetime.timedelta(seconds=10),
                     wait_for_workers=False)
    store.set("mpi_train/objects/1/0", pickle.dumps(Planted(str(planted))))
    with pytest.raises(UserError, match=r"the store key 'mpi_train/objects/1/0' \(allgather\) is garbled or forged"):
        StoreChannel(store, rank=1, world_size=2).allgather("mine")
    assert not planted.exists()
    with pytest.raises(UserError, match="mpi_train/failure' is garbled or forged"):  # the failure report's key too
        checked_failure(pickle.dumps(Planted(str(planted))))
    assert not planted.exists()
    assert checked_failure(json.dumps({"rank": 2, "host": "h", "traceback": "t"}).encode())["rank"] == 2


def test_the_server_will_not_open_the_store_to_a_network_without_authentication(tmp_path, capsys):
    assert server_main(["--host", "0.0.0.0", "--root", str(tmp_path / "mlruns")]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "--host 0.0.0.0 would open the tracking server to the network without authentication" in error
    assert "Add --auth" in error and "--insecure" in error and not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("flags,words", [
    (["--port", "99999"], "argument --port: '99999' is not a port, a whole number from 1 to 65535."),
    (["--workers", "0"], "argument --workers: '0' is not a count of processes, a whole number from 1 to 64."),
])
def test_the_server_refuses_a_port_or_worker_count_no_server_can_take_in_one_paragraph(tmp_path, capsys, flags, words):
    with pytest.raises(SystemExit) as exit_:
        server_main([*flags, "--root", str(tmp_path / "mlruns")])
    error = " ".join(capsys.readouterr().err.split())
    assert exit_.value.code == 2 and words in error and "Traceback" not in error
    assert not (tmp_path / "mlruns").exists()


def test_the_server_refuses_a_port_in_use_an_address_not_this_machines_or_a_store_it_cannot_open_before_mlflow_starts(
        tmp_path, capsys, monkeypatch):
    with socket.socket() as holder:  # another program on the port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert server_main(["--port", str(port), "--root", str(tmp_path / "mlruns")]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"the server cannot listen on 127.0.0.1:{port}: port {port} is in use by another program" in error
    assert server_main(["--host", "192.0.2.1", "--root", str(tmp_path / "mlruns")]) == 2  # TEST-NET-1, no --auth:
    error = " ".join(capsys.readouterr().err.split())
    assert "192.0.2.1 is not an address of this machine (`ip -brief address` lists them)" in error  # said first
    assert "--auth to require" not in error
    assert not (tmp_path / "mlruns").exists()
    (tmp_path / "a-file").write_text("")
    assert server_main(["--port", str(free_port()), "--root", str(tmp_path / "a-file")]) == 2
    error = " ".join(capsys.readouterr().err.split())  # the server's own words: it has no job, nor --no-tracking
    assert "The server keeps its runs and artifacts there" in error and "--no-tracking" not in error, error
    # each once MLflow's traceback: two minutes of retries, a Python traceback, MLflow's after it started
    (tmp_path / "folder-db" / "mlflow.db").mkdir(parents=True)
    assert server_main(["--port", str(free_port()), "--root", str(tmp_path / "folder-db")]) == 2
    assert f"{tmp_path}/folder-db/mlflow.db is a folder, where the server keeps its SQLite store" in \
           " ".join(capsys.readouterr().err.split())
    (tmp_path / "auth" / "credentials").mkdir(parents=True)
    assert server_main(["--port", str(free_port()), "--root", str(tmp_path / "auth"), "--auth"]) == 2
    assert "credentials, where the server keeps its admin's user and password, is a folder. Move it aside" in \
           " ".join(capsys.readouterr().err.split())
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "bobpass")
    assert server_main(["--port", str(free_port()), "--root", str(tmp_path / "auth"), "--auth"]) == 2
    assert "has 7 characters, and MLflow's authentication takes none under 12" in \
           " ".join(capsys.readouterr().err.split())


@pytest.mark.e2e
def test_the_rendezvous_store_listens_on_loopback_alone_for_a_job_on_one_host(tmp_path):
    job = LiveJob(4, [*QUICK, "--max-steps", "6", "--no-tracking"], tmp_path, 6, env={"MPI_TRAIN_SLOW": "0:0.4"})
    try:
        job.wait_for_step(2)
        port = int(re.search(r"rendezvous 127\.0\.0\.1:(\d+)", job.output).group(1))
        assert listening_on(port) == {"127.0.0.1"}
    finally:
        assert job.wait(120) == 0, job.output


@pytest.mark.e2e
def test_an_authenticated_server_lets_in_the_job_with_credentials_and_no_one_else(tmp_path, capsys):
    password = f"pw-{uuid.uuid4().hex}"
    credentials = {"MLFLOW_TRACKING_USERNAME": "tester", "MLFLOW_TRACKING_PASSWORD": password}
    server = MlflowServer(tmp_path, credentials=credentials)
    try:
        uri = server.uri()
        with pytest.raises(urllib.error.HTTPError) as refused:  # anonymous REST: refused
            urllib.request.urlopen(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10)
        assert refused.value.code == 401

        started = time.monotonic()
        without = mpirun(2, [*QUICK, "--tracking-uri", uri, "--experiment", "secured"], timeout=120,
                         env={"MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""}, cwd=tmp_path)
        assert without.returncode != 0 and time.monotonic() - started < 30
        message = " ".join(without.stderr.split())
        assert f"The MLflow server at {uri} requires authentication and refused this request (401" in message, message
        assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in message
        assert not (tmp_path / "mlruns" / "spool").exists() or not list((tmp_path / "mlruns" / "spool").iterdir())
        # the commands that read or send runs: refused in the same words, and a replay keeps what it did not send
        spool = Spool(tmp_path / "elsewhere" / "job-1.jsonl")
        spool.add({"kind": "create_run", "local_id": "offline-1", "experiment": "secured", "run_name": "r",
                   "tags": {}, "start_time": 0}, uri)
        for command, arguments in ((compare_main, ["--experiment", "secured"]), (replay_main, [str(spool.path)])):
            assert command([*arguments, "--tracking-uri", uri]) == 2
            said = " ".join(capsys.readouterr().err.split())
            assert "refused this request (401: no user and password were given)" in said, said
        assert len(spool) == 1 and not spool.acked_path.exists()

        summary = tmp_path / "secured.json"
        with_them = mpirun(2, [*QUICK, "--tracking-uri", uri, "--experiment", "secured", "--summary-json",
                               str(summary)], timeout=180, env=credentials, cwd=tmp_path)
        assert with_them.returncode == 0, with_them.stdout + with_them.stderr
        client = client_for(uri)  # the test's own process reads the variables too
        os.environ.update(credentials)
        try:
            parent, children = job_runs(client, "secured", "allreduce-np2-seed42")
            assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"] * 2
            recorded = [json.dumps(parent.data.params), json.dumps(parent.data.tags),
                        *artifact_texts(client, parent.info.run_id, tmp_path / "artifacts")]
        finally:
            for name in credentials:
                os.environ.pop(name, None)
        for text in (*recorded, with_them.stdout, with_them.stderr, without.stdout, without.stderr,
                     summary.read_text()):
            assert password not in text
    finally:
        server.stop()
