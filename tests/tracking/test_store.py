"""The tracking store: one resolution of its URI (the flag, else $MLFLOW_TRACKING_URI, else the embedded store), a
new one opened by jobs started together, one whose disk fills mid-job."""

import http.server
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import free_port, tmpfs

from mpi_train.config import given_uri
from mpi_train.files import partial_name
from mpi_train.lab.bad_input_workspace import fill
from mpi_train.tracking import default_store_uri, resolve_uri


def test_the_flag_wins_then_the_environment_then_the_embedded_store(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://from-env:5000")
    assert resolve_uri("http://from-flag:5000") == "http://from-flag:5000"
    assert resolve_uri(None) == "http://from-env:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # set but empty names nothing
    assert resolve_uri(None) == default_store_uri() == "sqlite:///mlruns/mlflow.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert resolve_uri("") == default_store_uri()


def test_a_replay_without_flag_or_environment_is_given_no_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert given_uri(None) is None
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://from-env:5000")
    assert given_uri(None) == "http://from-env:5000" and given_uri("http://x:1") == "http://x:1"


def open_new_store(uri: str, start, outcomes) -> None:
    """A job's rank 0 opening the store: as every launch of a loop or a Slurm array does at once."""
    from mpi_train.tracking.store import mlflow_client

    start.wait()
    try:
        mlflow_client(uri).search_experiments()
        outcomes.put("ok")
    except Exception as error:  # noqa: BLE001 - what the job would have met
        outcomes.put(f"{type(error).__name__}: {str(error).splitlines()[0]}")


def test_jobs_started_at_once_on_a_new_store_each_open_it(tmp_path, capfd):
    """Four processes open one new SQLite store together, its folder not made yet (a fresh working directory): each
    makes the store in a folder of its own, the first renames its folder into place, and the others find it made
    (before, most of them failed on `table ... already exists`). MLflow's own lines about creating them are left
    out, and no process's folder is left beside the store."""
    import multiprocessing

    import mlflow  # noqa: F401 - imported once, here: the openers are forked from this process

    context = multiprocessing.get_context("fork")
    start, outcomes = context.Barrier(4), context.Queue()
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    openers = [context.Process(target=open_new_store, args=(uri, start, outcomes)) for _ in range(4)]
    for opener in openers:
        opener.start()
    for opener in openers:
        opener.join(120)
    assert sorted(outcomes.get(timeout=5) for _ in openers) == ["ok"] * 4
    assert "Creating initial MLflow database tables" not in capfd.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["mlruns"]


@pytest.fixture
def store_disk(tmp_path):
    """A real 2 MiB tmpfs for a store that fills up."""
    with tmpfs(tmp_path / "store", "2m") as disk:
        yield disk


def store_writes_to_a_run(folder: Path) -> tuple:
    """A job's client of a new SQLite store in `folder` (store_writes.py), what it warns, the store's address, an
    experiment and a run that holds one loss."""
    from mlflow.entities import Metric

    from mpi_train.tracking.store import mlflow_client
    from mpi_train.tracking.store_writes import StoreWrites

    said: list[str] = []
    uri = f"sqlite:///{folder}/mlflow.db"
    client = StoreWrites(mlflow_client(uri), uri, warn=said.append)
    experiment = client.create_experiment("runs", artifact_location=str(folder / "artifacts"))
    run = client.create_run(experiment).info.run_id
    client.log_batch(run, metrics=[Metric("loss", 1.0, 0, 0)])
    return client, said, uri, experiment, run


def test_a_store_whose_disk_fills_mid_job_is_said_once_and_what_it_lacks_is_counted(store_disk, tmp_path, capfd,
                                                                                    monkeypatch):
    from mlflow.entities import Metric

    from mpi_train.config import TrainConfig
    from mpi_train.tracking.saved_model import ModelSaving

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # MLflow's model files leave folders in it
    client, said, uri, experiment, run = store_writes_to_a_run(store_disk)
    fill(store_disk, leave=0)
    for step in range(1, 21):  # rows enough to need pages the disk no longer has
        client.log_batch(run, metrics=[Metric(f"m{key}", float(step), 0, step) for key in range(200)])
    client.set_terminated(run, "FINISHED")
    assert client.dropped > 0 and said == [(f"the MLflow store at {uri} refused a write (database or disk is full); "
                                            f"training continues, and what the store does not take is left out of "
                                            f"its runs.")]
    assert client.unrecorded() == (f"the MLflow store at {uri} refused {client.dropped} of its writes (database or "
                                   f"disk is full), so its runs lack those figures and may still show RUNNING: free "
                                   f"space on the store's disk (or make its file writable), or point --tracking-uri "
                                   f"at another store for the next run")
    assert [m.value for m in client.get_metric_history(run, "loss")] == [1.0]  # what it took before is there
    # --save-model's files go to the same full disk: the job says it was not saved, not how to load it
    saver = ModelSaving()
    saver.client, saver.parent_id, saver.experiment_id = client, run, experiment
    saver.config = TrainConfig(model="mnist_cnn", dataset="synthetic")
    assert saver.save_weights(saver.config.make_model().state_dict()) is None
    err = capfd.readouterr().err
    assert "Traceback" not in err and "SQLAlchemy database error" not in err, err
    assert "the MLflow store did not take the trained model (database or disk is full); it is not saved." in err


def test_a_run_deleted_mid_job_is_named_as_deleted_with_how_to_restore_it(tmp_path):
    from mlflow.entities import Metric

    from mpi_train.tracking.store import mlflow_client

    client, said, uri, _, run = store_writes_to_a_run(tmp_path)
    mlflow_client(uri).delete_run(run)  # another process, say the UI's trash button
    client.log_batch(run, metrics=[Metric("loss", 0.5, 0, 1)])
    client.set_terminated(run, "FINISHED")
    assert client.dropped == 2 and len(said) == 1 and f"run {run} was deleted" in said[0], said
    lacking = client.unrecorded()
    assert lacking.startswith(f"its run {run} was deleted from the MLflow store at {uri} (or its experiment was) "
                              f"while the job ran, so 2 of its writes were refused") and "disk" not in lacking
    assert f"`mlflow runs restore --run-id {run}`" in lacking


class HealthOnly(http.server.BaseHTTPRequestHandler):
    """A tracking server whose /health answers and whose API never does (its backend hung)."""

    def do_GET(self):
        if self.path.startswith("/health"):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")
            return
        time.sleep(5)  # past the client's timeout

    do_POST = do_GET

    def log_message(self, *args): ...


def test_a_server_whose_api_hangs_at_the_start_is_refused_unless_spooling_was_chosen(tmp_path, monkeypatch, capsys):
    from mpi_train.config import TrainConfig
    from mpi_train.errors import UserError
    from mpi_train.tracking.store import open_store

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HealthOnly)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(UserError) as refused:
            open_store(TrainConfig(tracking_uri=uri))
        assert str(refused.value).startswith(f"The MLflow server at {uri} answers its /health but not its tracking "
                                             f"API (MlflowException: API request to {uri}/api/2.0/mlflow/experiments/"
                                             f"get-by-name got no answer within 1 s). See the server's log. To train "
                                             f"now and send the runs later, pass --tracking-spool."), refused.value
        connection = open_store(TrainConfig(tracking_uri=uri, tracking_spool=True))
    finally:
        server.shutdown()
    assert connection.experiment_id is None and connection.client.down  # offline: every write goes to the spool
    said = capsys.readouterr().err
    assert "not its tracking API" in said and "Training anyway (--tracking-spool)" in said, said


class NotMlflow(http.server.BaseHTTPRequestHandler):
    """Some other web server at the address given: its /health answers, any other path is its 404 page."""

    def do_GET(self):
        found = self.path.startswith("/health")
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain" if found else "text/html")
        self.end_headers()
        self.wfile.write(b"OK" if found else b"<html><body><h1>404 Not Found</h1></body></html>")

    do_POST = do_GET

    def log_message(self, *args): ...


def test_replay_and_compare_at_an_address_that_is_not_mlflow_keep_the_spool_and_say_so(tmp_path, monkeypatch,
                                                                                      capsys):
    """A replay aimed at the wrong server once marked the run's creation refused, so a later replay to the right one
    lost the run: nothing is sent or marked, and both commands name the address as not MLflow's."""
    from mpi_train.analysis.compare import main as compare_main
    from mpi_train.tracking.replay import main as replay_main
    from mpi_train.tracking.spool import Spool

    monkeypatch.chdir(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotMlflow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    spool = Spool(tmp_path / "mlruns" / "spool" / "job-1.jsonl")
    spool.add({"kind": "create_run", "local_id": "offline-1", "experiment": "e", "run_name": "r", "tags": {},
               "start_time": 0}, "http://127.0.0.1:1")
    try:
        assert replay_main(["--tracking-uri", uri]) == 2
        said = " ".join(capsys.readouterr().err.split())
        assert compare_main(["--tracking-uri", uri, "--experiment", "e"]) == 2
        compared = " ".join(capsys.readouterr().err.split())
    finally:
        server.shutdown()
    assert (f"{uri} answered /api/2.0/mlflow/experiments/get-by-name with HTTP 404 and a page that is not MLflow's: "
            f"nothing there is an MLflow tracking server") in said, said
    assert "Nothing was sent; mlruns/spool/job-1.jsonl is kept." in said and "Traceback" not in said
    assert len(spool) == 1 and not spool.acked_path.exists()
    assert "is not MLflow's" in compared and compared.endswith("Nothing was compared."), compared
    assert replay_main(["mlruns/spool/sent-and-removed.jsonl"]) == 2
    assert "sent-and-removed.jsonl does not exist: a spool is removed once everything in it was sent" in " ".join(
        capsys.readouterr().err.split())


def test_a_store_made_by_a_job_stopped_midway_is_not_left_half_made(tmp_path):
    from mpi_train.tracking.store import make_store, mlflow_client, store_damage

    def stopped(tracking_uri: str):  # MLflow creating the tables when Ctrl-C comes
        Path(tracking_uri.removeprefix("sqlite:///")).write_bytes(b"SQLite format 3\x00" + bytes(4080))
        raise KeyboardInterrupt

    database = tmp_path / "mlflow.db"
    with pytest.raises(KeyboardInterrupt):
        make_store(database, stopped)
    assert list(tmp_path.iterdir()) == []  # neither a store nor its partial
    # in a folder not made yet: no empty folder is left either, nor the folder a killed job made its store in
    nested = tmp_path / "runs" / "mlruns" / "mlflow.db"
    with pytest.raises(KeyboardInterrupt):
        make_store(nested, stopped)
    killed = tmp_path / partial_name("runs", 2 ** 22 + 1)  # above pid_max: no process has it
    (killed / "mlruns").mkdir(parents=True)
    assert mlflow_client(f"sqlite:///{nested}").search_experiments() and nested.exists()
    assert [path.name for path in tmp_path.iterdir()] == ["runs"]
    uri = f"sqlite:///{database}"
    assert mlflow_client(uri).get_experiment_by_name("Default") is not None and database.exists()
    # a store left half-made before stores were made whole: MLflow's upgrade meets the table it left
    left = RuntimeError("(sqlite3.OperationalError) table _alembic_tmp_experiments already exists")
    refused = store_damage(uri, left)
    assert str(refused).startswith(f"The MLflow store {database} is damaged: it was left half-made, by a job stopped "
                                   f"while MLflow created or upgraded its tables.")
    assert f"mv {database} {database}.damaged" in str(refused)


def test_a_database_whose_driver_is_not_installed_names_the_package_to_install():
    import importlib.util

    from mpi_train.errors import UserError
    from mpi_train.tracking.store import mlflow_client

    assert importlib.util.find_spec("pyodbc") is None  # SQLAlchemy's driver for mssql://, which the test extras lack
    with pytest.raises(UserError) as refused:
        mlflow_client("mssql://user:secret@localhost/runs")
    assert str(refused.value).startswith("--tracking-uri mssql://user:***@localhost/runs needs the Python package "
                                         "pyodbc (the database's driver), which is not installed where rank 0 runs")
    assert "pip install 'pyodbc'" in str(refused.value) and "secret" not in str(refused.value)


def test_a_store_another_mlflow_made_is_named_with_its_upgrade_by_every_command(tmp_path, capsys):
    import sqlite3

    from mpi_train.errors import UserError
    from mpi_train.tracking.server import main as server_main
    from mpi_train.tracking.store import mlflow_client

    database = tmp_path / "mlflow.db"
    uri = f"sqlite:///{database}"
    mlflow_client(f"sqlite:///{tmp_path}/./mlflow.db")  # MLflow keeps a store per address, checked once
    with sqlite3.connect(database) as db:  # as an older MLflow left it
        db.execute("UPDATE alembic_version SET version_num = '0c779009ac13'")
    with pytest.raises(UserError) as refused:
        mlflow_client(uri)  # what a job's rank 0, compare and replay open their store with
    message = str(refused.value)
    assert message.startswith(f"The MLflow store {uri} was made by another version of MLflow: its tables are at "
                              f"schema 0c779009ac13"), message
    assert f"`mlflow db upgrade {uri}`" in message and message.endswith("or point --tracking-uri at another store.")
    assert server_main(["--root", str(tmp_path), "--port", str(free_port())]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "was made by another version of MLflow" in said and said.endswith("or pass --root with another folder.")


@pytest.mark.parametrize("uri, says", [
    ("https://no-such-host.invalid", "The host name no-such-host.invalid does not resolve here: correct"),
    ("http://127.0.0.1:{port}", "Start one with `python -m mpi_train server --host 127.0.0.1 --port {port}`"),
    ("https://127.0.0.1:{plain}", "Something there answers plain HTTP, not HTTPS: write http://127.0.0.1:{plain}"),
])
def test_a_server_that_does_not_answer_is_told_by_what_the_address_lacks(uri, says):
    from mpi_train.tracking.probe import ServerUnreachable, probe_server

    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotMlflow)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    closed = free_port()
    values = {"port": closed, "plain": plain.server_address[1]}
    try:
        with pytest.raises(ServerUnreachable) as refused:
            probe_server(uri.format(**values), timeout_s=1, otherwise="or else")
    finally:
        plain.shutdown()
    assert says.format(**values) in str(refused.value) and str(refused.value).endswith(", or else."), refused.value


def test_a_store_path_too_long_for_sqlite_is_refused_before_mlflow_retries_it(tmp_path, monkeypatch):
    from mpi_train.config import TrainConfig
    from mpi_train.errors import UserError
    from mpi_train.tracking.store import SQLITE_MAX_PATH, open_store

    deep = tmp_path
    while len(f"{deep}/mlflow.db") <= SQLITE_MAX_PATH:  # folders a file system takes (at most 255 characters a name)
        deep = deep / ("d" * max(1, min(100, SQLITE_MAX_PATH + 1 - len(f"{deep}//mlflow.db"))))
    with pytest.raises(UserError) as refused:
        open_store(TrainConfig(tracking_uri=f"sqlite:///{deep}/mlflow.db"))
    assert (f"has a path of {len(f'{deep}/mlflow.db')} characters, and SQLite opens none longer than "
            f"{SQLITE_MAX_PATH}") in str(refused.value)
    assert list(tmp_path.iterdir()) == []
