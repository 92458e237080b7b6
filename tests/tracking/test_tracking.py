"""Experiment tracking against a real MLflow server: run structure, params, metrics, statuses, artifacts."""

import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from conftest import MPI_ENV, REPO, client_for, free_port, job_runs, losses, mpirun, train, wait_for

from mpi_train.config import TrainConfig, redact_uri
from mpi_train.errors import UserError
from mpi_train.lab import mpirun as launch
from mpi_train.models import build_model
from mpi_train.tracking.sampler import HostSampler
from mpi_train.tracking.sender import BatchSender
from mpi_train.tracking.server import main as server_main
from mpi_train.tracking.store import check_uri, mlflow_client, open_store
from mpi_train.train import parameter_digest

# Tests that run jobs or use the session's server are e2e; the URI, store-folder, sampler and sender checks run
# in-process.

PARENT_STEP_METRICS = ("learning/loss", "learning/lr", "time/step_s", "time/data_s", "time/compute_s", "time/sync_s",
                       "time/optimizer_s", "time/samples_per_s", "time/samples_per_s_per_rank", "time/data_share",
                       "time/flops_per_s")
CHILD_STEP_METRICS = ("rank/loss", "rank/data_s", "rank/compute_s", "rank/sync_s", "rank/optimizer_s", "rank/step_s")
PARAMS = ("sync", "backend", "world_size", "batch_size", "batch_size_per_rank", "model", "dataset", "lr",
          "momentum", "weight_decay", "epochs", "max_steps", "seed", "hosts", "overlap", "loader",
          "deterministic", "synthetic_size", "gpt_size", "data_dir")
QUICK = ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "2"]


def artifact_paths(client, run_id: str, path=None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= artifact_paths(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def read_artifact(client, run_id: str, path: str, tmp_path: Path) -> str:
    return Path(client.download_artifacts(run_id, path, str(tmp_path))).read_text()


@pytest.fixture(scope="module")
def allreduce_runs(mlflow_server, tracked_jobs):
    client = client_for(mlflow_server)
    return (client, *job_runs(client, "tests-compare", "allreduce-np2-seed42"))


@pytest.mark.e2e
def test_one_parent_run_per_job_and_one_child_per_rank(allreduce_runs):
    _client, parent, children = allreduce_runs
    assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"] * 2
    assert [c.data.tags["rank"] for c in children] == ["0", "1"]
    for child in children:
        assert {"rank", "local_rank", "host", "pid"} <= set(child.data.tags)
        assert child.data.params == {"seed": "42"}
    params = parent.data.params
    assert set(PARAMS) <= set(params) and "bucket_mb" not in params  # allreduce cuts no buckets: it logs no size
    assert (params["sync"], params["world_size"], params["batch_size"], params["batch_size_per_rank"],
            params["seed"]) == ("allreduce", "2", "64", "32", "42")
    assert {"torch_version", "mpi4py_version", "mpi_library_version"} <= set(parent.data.tags)
    assert "Open MPI" in parent.data.tags["mpi_library_version"]


@pytest.mark.e2e
def test_metrics_have_the_same_keys_and_every_logged_step(allreduce_runs, tracked_jobs):
    client, parent, children = allreduce_runs
    logged_steps = [s["step"] for s in tracked_jobs["allreduce"]["steps"]]
    assert logged_steps == [2, 4, 6, 8]
    for key in PARENT_STEP_METRICS:
        assert [m.step for m in client.get_metric_history(parent.info.run_id, key)] == logged_steps, key
    losses = [m.value for m in client.get_metric_history(parent.info.run_id, "learning/loss")]
    assert losses == pytest.approx([s["loss"] for s in tracked_jobs["allreduce"]["steps"]])
    # the test figures at the epoch's end, with the training time and bytes it took to get there
    for key in ("learning/test_accuracy", "time/elapsed_s", "network/sent_mb"):
        assert [m.step for m in client.get_metric_history(parent.info.run_id, key)] == [8], key
    assert 0 < parent.data.metrics["time/elapsed_s"] <= tracked_jobs["allreduce"]["wall_time_s"]
    sections = {key.split("/")[0] for key in parent.data.metrics}
    assert sections == {"learning", "time", "summary", "system", "network", "memory"}, sections  # each in its kind's
    summary = {key for key in parent.data.metrics if key.startswith("summary/")}
    assert {"summary/step_s", "summary/data_s", "summary/compute_s", "summary/sync_s", "summary/optimizer_s",
            "summary/samples_per_s", "summary/sync_share", "summary/final_loss", "summary/test_accuracy",
            "summary/wall_time_s", "summary/tracking_share"} <= summary
    assert {m.step for m in client.get_metric_history(parent.info.run_id, "summary/step_s")} == {0}  # bars, not lines
    # one mean per phase: no whole-run or total variants beside it
    assert not any("mean_" in key or key.startswith("summary/total_") and key != "summary/total_steps"
                   for key in parent.data.metrics)
    steady = tracked_jobs["allreduce"]["mean_times_after_warmup"]  # the summary's rule: warm-up steps left out
    assert parent.data.metrics["summary/sync_s"] == pytest.approx(steady["sync_time_s"])
    assert parent.data.metrics["summary/sync_share"] == pytest.approx(steady["sync_time_s"] / steady["step_time_s"])
    # throughput: per rank, half the job's on 2 ranks; FLOP/s from the model's count; no MFU on a CPU
    speed = tracked_jobs["allreduce"]["throughput"]
    assert speed["device_name"] == "cpu" and "mfu" not in speed and "time/mfu" not in parent.data.metrics
    assert parent.data.metrics["summary/samples_per_s_per_rank"] == pytest.approx(
        parent.data.metrics["summary/samples_per_s"] / 2)
    assert parent.data.metrics["summary/flops_per_s"] == pytest.approx(
        speed["flops_per_sample"] * speed["samples_per_s_per_rank"])
    assert 0 < parent.data.metrics["summary/data_share"] == pytest.approx(steady["data_time_s"] / steady["step_time_s"])
    assert "--timing-warmup-steps" in parent.data.tags["mlflow.note.content"]  # the rule, said on the run
    assert any(key.startswith("system/") and key.endswith("/cpu_utilization_percentage") for key in parent.data.metrics)
    child_losses = []
    for child in children:
        for key in CHILD_STEP_METRICS:
            assert [m.step for m in client.get_metric_history(child.info.run_id, key)] == logged_steps, key
        child_losses.append([m.value for m in client.get_metric_history(child.info.run_id, "rank/loss")])
        assert {key.split("/")[0] for key in child.data.metrics} == {"rank", "memory"}
        assert "rank/mean_step_s" in child.data.metrics
        # memory per rank, once: allreduce keeps whole parameters, gradients and momentum buffers, as the model says
        held = {key: m for key, m in child.data.metrics.items() if key.startswith("memory/")}
        assert {m.step for m in (client.get_metric_history(child.info.run_id, key)[0] for key in held)} == {0}
        assert held["memory/gradients_bytes"] == held["memory/parameters_bytes"] > 0
        assert held["memory/optimizer_bytes"] == held["memory/parameters_bytes"]  # SGD momentum: one buffer each
        assert held["memory/total_bytes"] == 3 * held["memory/parameters_bytes"]
    memory = tracked_jobs["allreduce"]["memory"]
    assert parent.data.metrics["memory/total_bytes"] == memory["most"]["total_bytes"]
    assert parent.data.metrics["memory/predicted_total_bytes"] == memory["predicted"]["total_bytes"] == memory[
        "most"]["total_bytes"]
    # the parent's loss is the ranks' mean
    assert [sum(pair) / 2 for pair in zip(*child_losses)] == pytest.approx(losses)


@pytest.mark.e2e
def test_artifacts_hold_config_summary_console_and_environment(allreduce_runs, tmp_path):
    client, parent, _ = allreduce_runs
    run_id = parent.info.run_id
    assert ({"config.json", "config.toml", "summary.json", "console.log", "environment.json"}
            <= artifact_paths(client, run_id))
    config = json.loads(read_artifact(client, run_id, "config.json", tmp_path))
    assert config["seed"] == 42 and config["sync"] == "allreduce"
    summary = json.loads(read_artifact(client, run_id, "summary.json", tmp_path))
    assert len(summary["steps"]) == 4 and summary["world_size"] == 2
    assert "done in" in read_artifact(client, run_id, "console.log", tmp_path)
    environment = json.loads(read_artifact(client, run_id, "environment.json", tmp_path))
    assert "slots=2" in environment["hostfile"] and "Open MPI" in environment["mpi_library"]


@pytest.mark.e2e
def test_the_saved_model_loads_with_the_trained_weights_and_the_registry_takes_it(allreduce_runs, tracked_jobs,
                                                                                  mlflow_server, tmp_path, monkeypatch):
    """--save-model: mlflow.pytorch.load_model("runs:/<run id>/model") gives the job's final weights, bit for bit (the
    summary's digest, through the package's own model), and their logits; the Model Registry takes it as it is."""
    import mlflow
    import mlflow.pytorch

    client, parent, _ = allreduce_runs
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # where runs:/ and models:/ URIs resolve
    # MLflow downloads each model it loads into a temporary folder it never removes: this test's own, here
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    uri = f"runs:/{parent.info.run_id}/model"
    loaded = mlflow.pytorch.load_model(uri)
    trained = build_model("mnist_cnn").eval()
    trained.load_state_dict(loaded.state_dict())  # strict: the same tensors by name and shape
    assert parameter_digest(trained) == tracked_jobs["allreduce"]["weights_sha256"]
    batch = torch.randn(5, 1, 28, 28, generator=torch.Generator().manual_seed(0))  # not the example's batch size
    with torch.no_grad():
        logits = trained(batch)
        torch.testing.assert_close(loaded(batch), logits)
    signature = mlflow.models.get_model_info(uri).signature
    assert [spec.shape for spec in (*signature.inputs.inputs, *signature.outputs.inputs)] == [(-1, 1, 28, 28), (-1, 10)]
    assert [model.name for model in client.search_logged_models([parent.info.experiment_id])
            if model.source_run_id == parent.info.run_id] == ["model"]
    version = mlflow.register_model(uri, "tests-mnist-cnn")
    with torch.no_grad():
        torch.testing.assert_close(mlflow.pytorch.load_model(f"models:/tests-mnist-cnn/{version.version}")(batch),
                                   logits)
    assert (f'mlflow.set_tracking_uri("{mlflow_server}"); mlflow.pytorch.load_model("{uri}") loads it'
            in read_artifact(client, parent.info.run_id, "console.log", tmp_path))


@pytest.mark.e2e
def test_no_secret_reaches_params_tags_or_artifacts(allreduce_runs, tmp_path):
    client, parent, children = allreduce_runs
    texts = [json.dumps(parent.data.params), json.dumps(parent.data.tags)] + [json.dumps(c.data.tags) for c in children]
    texts += [read_artifact(client, parent.info.run_id, name, tmp_path)
              for name in ("config.json", "config.toml", "environment.json", "summary.json", "console.log")]
    for text in texts:
        assert "s3cret" not in text
    assert redact_uri("http://alice:pw@host:5000/x") == "http://alice:***@host:5000/x"


@pytest.mark.e2e
def test_the_logged_config_toml_reruns_the_job_to_the_same_losses_bit_for_bit(allreduce_runs, tracked_jobs, tmp_path):
    client, parent, _ = allreduce_runs
    job_file = read_artifact(client, parent.info.run_id, "config.toml", tmp_path)
    assert 'sync = "allreduce"' in job_file and "seed = 42" in job_file and "summary_json" not in job_file
    first, rerun = tracked_jobs["allreduce"], tracked_jobs["rerun"]  # the rerun: --config config.toml --experiment
    assert rerun["config"]["seed"] == 42 and losses(rerun) == losses(first) and len(losses(first)) == 4
    assert rerun["final_loss"] == first["final_loss"]
    # the same job but for where it is recorded (its URI from the environment) and its summary
    changed = {key for key, value in first["config"].items() if rerun["config"][key] != value}
    assert changed == {"experiment", "tracking_uri", "summary_json"}, changed


@pytest.mark.e2e
def test_a_failing_rank_marks_the_run_failed_with_its_traceback(mlflow_server, tmp_path):
    result = mpirun(2, [*QUICK, "--max-steps", "8", "--tracking-uri", mlflow_server, "--experiment", "tests-fail"],
                    env={"MPI_TRAIN_FAIL_AT": "1:3"})
    assert result.returncode != 0
    client = client_for(mlflow_server)
    parent, children = job_runs(client, "tests-fail", "allreduce-np2-seed42")
    assert parent.info.status == "FAILED"
    assert [c.info.status for c in children] == ["KILLED", "FAILED"]
    assert parent.data.tags["mpi_train.failed_rank"] == "1" and parent.data.tags["mpi_train.failed_host"]
    assert "injected failure on rank 1" in parent.data.tags["mpi_train.error"]
    traceback = read_artifact(client, parent.info.run_id, "failure/traceback_rank1.txt", tmp_path)
    assert "Traceback" in traceback and "injected failure on rank 1 at 3" in traceback


@pytest.mark.e2e
@pytest.mark.parametrize("target", ["mpirun", "rank0"])
def test_sigterm_marks_the_run_killed(mlflow_server, target):
    client = client_for(mlflow_server)
    run_name = f"sigterm-to-{target}"
    command = ["mpirun", "-np", "2", "--oversubscribe", sys.executable, "-m", "mpi_train", *QUICK, "--epochs", "50",
               "--tracking-uri", mlflow_server, "--experiment", "tests-kill", "--run-name", run_name]
    with launch.launched(command, {**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO)}, cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as job:
        def logged_a_loss() -> bool:
            assert job.poll() is None, "the job ended before it logged a step"
            experiment = client.get_experiment_by_name("tests-kill")
            runs = (client.search_runs([experiment.experiment_id], f"attributes.run_name = '{run_name}'")
                    if experiment else [])
            return bool(runs) and "learning/loss" in runs[0].data.metrics

        wait_for(logged_a_loss, 90, "training to log metrics to the server", every_s=0.5)
        if target == "mpirun":
            job.send_signal(signal.SIGTERM)
        else:  # rank 0's pid is a tag of its child run
            _, children = job_runs(client, "tests-kill", run_name)
            os.kill(int(children[0].data.tags["pid"]), signal.SIGTERM)
        job.wait(timeout=60)
    assert job.returncode != 0
    def ended():  # mpirun SIGKILLs ranks ~0.2 s after SIGTERM; the guard process may finish the job
        parent, children = job_runs(client, "tests-kill", run_name)
        return parent.info.status != "RUNNING" and (parent, children)

    parent, children = wait_for(ended, 30, f"the runs of {run_name} to end", every_s=0.5)
    assert parent.info.status == "KILLED" and [c.info.status for c in children] == ["KILLED"] * 2
    assert parent.data.tags["mpi_train.killed_by"] == "SIGTERM"


@pytest.mark.e2e
def test_without_a_uri_the_embedded_sqlite_store_under_mlruns_is_used(tmp_path):
    summary = train(2, tmp_path, *QUICK, "--max-steps", "4", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": ""})
    assert summary["config"]["tracking_uri"] is None
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()
    client = client_for(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    parent, children = job_runs(client, "mpi_train", "allreduce-np2-seed42")
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert Path(parent.info.artifact_uri.removeprefix("file://")).is_relative_to(tmp_path / "mlruns")
    assert "summary.json" in artifact_paths(client, parent.info.run_id)


@pytest.mark.e2e
def test_an_unreachable_server_is_reported_before_training(tmp_path):
    from conftest import free_port

    started = time.monotonic()
    uri = f"http://127.0.0.1:{free_port()}"
    result = mpirun(2, [*QUICK, "--max-steps", "4", "--tracking-uri", uri], cwd=tmp_path)
    assert result.returncode != 0 and time.monotonic() - started < 30
    assert "Traceback" not in result.stderr and result.stderr.count("mpi_train: error:") == 1
    text = " ".join(result.stderr.split())
    assert f"No MLflow tracking server answers at {uri}" in text and "python -m mpi_train server" in text
    assert "loss" not in result.stdout  # no training happened


@pytest.mark.parametrize("uri, needle", [
    ("http://127.0.0.1:notaport", "is malformed"),
    ("htp://127.0.0.1:5000", "unknown scheme 'htp'"),
    ("http://", "has no host"),
    ("/tmp/some/folder", "folder of files"),
    ("file:///tmp/mlruns", "folder of files"),
    ("sqlite://", "held in memory"),
    ("sqlite:///:memory:", "held in memory"),
    # each once passed the check and ended in a traceback from MLflow
    (" sqlite:///mlruns/mlflow.db", "takes as part of the address. Give it as sqlite:///mlruns/mlflow.db"),
    ("SQLITE:///mlruns/mlflow.db", "has its scheme in capitals"),
    ("sqlite://mlruns/mlflow.db", "(it takes three slashes, then the path). Give sqlite:///mlruns/mlflow.db"),
])
def test_malformed_uris_are_refused_with_the_fix(uri, needle):
    with pytest.raises(UserError, match="--tracking-uri") as caught:
        open_store(TrainConfig(tracking_uri=uri))
    message = str(caught.value)
    assert needle in message and ("http://HOST:PORT" in message or "sqlite:///" in message)


def test_a_store_path_that_is_a_folder_a_plain_file_or_not_mlflows_is_refused_and_left_as_it_is(tmp_path):
    from mpi_train.tracking import check_store_exists, mlflow_client

    (tmp_path / "mlruns").mkdir()
    with pytest.raises(UserError, match=rf"names the folder {tmp_path}/mlruns, where a SQLite file belongs\. Name the "
                                        rf"database file, e.g\. sqlite:///{tmp_path}/mlruns/mlflow\.db"):
        mlflow_client(f"sqlite:///{tmp_path}/mlruns")  # once a traceback of 60 lines, "unable to open database file"
    theirs = tmp_path / "notes.db"
    with contextlib.closing(sqlite3.connect(theirs)) as db:
        db.execute("CREATE TABLE notes (x)")
        db.commit()
    before = theirs.read_bytes()
    with pytest.raises(UserError, match=r"is a SQLite file but not an MLflow store \(its tables: notes\)"):
        check_store_exists(f"sqlite:///{theirs}")  # compare once wrote MLflow's 60 tables into it
    assert theirs.read_bytes() == before
    with pytest.raises(UserError, match=rf"names the file {theirs} as a plain path, .* Give the SQLite file as a URI: "
                                        rf"sqlite:///{theirs}"):
        open_store(TrainConfig(tracking_uri=str(theirs)))


def test_databricks_without_credentials_is_refused_before_mlflow_reads_them(tmp_path, monkeypatch):
    for variable in ("DATABRICKS_HOST", "DATABRICKS_CONFIG_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "databrickscfg"))
    with pytest.raises(UserError, match=r"^--tracking-uri 'databricks' names Databricks' hosted MLflow, and neither "
                                        r"\$DATABRICKS_HOST nor a .*databrickscfg names the workspace"):
        check_uri("databricks")  # once MLflow's traceback of 30 lines
    (tmp_path / "databrickscfg").write_text("[DEFAULT]\nhost = https://x\n")
    assert check_uri("databricks") == "databricks"
    with pytest.raises(UserError, match=r"databrickscfg has no profile \[team\]"):
        check_uri("databricks://team")


def test_a_uri_from_the_environment_is_named_as_the_variable(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:///tmp/runs")
    with pytest.raises(UserError, match=r"^\$MLFLOW_TRACKING_URI 'file:///tmp/runs' names a folder of files"):
        open_store(TrainConfig(tracking_uri=None))
    with pytest.raises(UserError, match=r"^--tracking-uri 'htp://x:5000' has an unknown scheme"):
        open_store(TrainConfig(tracking_uri="htp://x:5000"))


def test_an_unwritable_mlruns_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlruns").write_text("a file where the store folder should be")
    with pytest.raises(UserError, match="not a writable folder") as caught:
        open_store(TrainConfig())
    assert str(tmp_path / "mlruns") in str(caught.value) and "--no-tracking" in str(caught.value)


def test_a_deleted_experiment_is_refused_with_how_to_restore_it(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow_client(uri)
    client.delete_experiment(client.create_experiment("gone"))
    with pytest.raises(UserError) as caught:
        open_store(TrainConfig(tracking_uri=uri, experiment="gone"))
    assert str(caught.value) == (f"Experiment 'gone' at {uri} was deleted: it is in MLflow's trash, which takes no "
                                 f"run. Restore it (`mlflow experiments restore --experiment-id 1`, with "
                                 f"MLFLOW_TRACKING_URI={uri}), or name another --experiment.")
    from mpi_train.analysis.compare import main as compare_main

    # compare once said "no FINISHED jobs ... Run some first", and training refuses that very command
    assert compare_main(["--experiment", "gone", "--tracking-uri", uri, "--out", str(tmp_path / "plots")]) == 2
    assert "in MLflow's trash, which compare does not read. Restore it" in " ".join(capsys.readouterr().err.split())
    client.restore_experiment(client.get_experiment_by_name("gone").experiment_id)
    # named by the id its link shows: found, and said to hold no finished job yet
    assert compare_main(["--experiment", "1", "--tracking-uri", uri, "--out", str(tmp_path / "plots")]) == 2
    assert f"Experiment 'gone' at {uri} has no FINISHED jobs to compare" in " ".join(capsys.readouterr().err.split())


def a_real_sqlite_file(path: Path, table: str = "notes") -> Path:
    """An SQLite database of a few pages, written by SQLite itself."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(f"CREATE TABLE {table} (version_num TEXT)")
        db.executemany(f"INSERT INTO {table} VALUES (?)", [("x" * 500,) for _ in range(100)])
        db.commit()
    return path


def test_a_store_overwritten_with_random_bytes_is_named_damaged_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    database = a_real_sqlite_file(tmp_path / "mlruns" / "mlflow.db")
    database.write_bytes(os.urandom(database.stat().st_size))
    with pytest.raises(UserError) as caught:
        open_store(TrainConfig())  # the default store, sqlite:///mlruns/mlflow.db
    message = str(caught.value)
    assert f"The MLflow store {database} is damaged: it does not begin with SQLite's header" in message
    assert f"mv {database} {database}.damaged" in message and "--tracking-uri" in message
    assert "MLFLOW_TRACKING_URI" in message


def test_a_store_whose_pages_are_overwritten_behind_an_intact_header_is_named_damaged(tmp_path):
    database = a_real_sqlite_file(tmp_path / "runs.db")
    with open(database, "r+b") as handle:
        handle.seek(100)  # past the 100-byte file header: the table list's page
        handle.write(random.Random(0).randbytes(4000))  # random, the same each run
    with pytest.raises(UserError, match="SQLite cannot read its pages") as caught:
        mlflow_client(f"sqlite:///{database}")
    assert f"The MLflow store {database} is damaged" in str(caught.value)


def test_a_store_damaged_past_the_pages_the_check_reads_is_named_damaged_where_mlflow_opens_it(tmp_path):
    database = a_real_sqlite_file(tmp_path / "runs.db", "alembic_version")  # the first table MLflow reads
    size = database.stat().st_size
    with open(database, "r+b") as handle:
        handle.seek(4096)  # every page but the first, which holds the header and the table list
        handle.write(random.Random(0).randbytes(size - 4096))
    with pytest.raises(UserError, match="SQLite cannot read its pages") as caught:
        mlflow_client(f"sqlite:///{database}")  # SQLite's own error, raised from inside MLflow's start
    assert f"The MLflow store {database} is damaged" in str(caught.value)


def test_the_server_command_names_a_damaged_store_and_starts_no_server(tmp_path, capsys):
    root = tmp_path / "mlruns"
    root.mkdir()
    (root / "mlflow.db").write_bytes(os.urandom(8192))
    assert server_main(["--root", str(root), "--port", str(free_port())]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"The MLflow store {root / 'mlflow.db'} is damaged" in error and "--root" in error
    assert "Traceback" not in error


@pytest.mark.e2e
def test_a_server_stopped_while_it_makes_a_new_store_leaves_nothing_behind(tmp_path):
    """Ctrl-C (here SIGTERM, which the command takes alike) while MLflow creates the new store's tables: neither a
    half-made store, which every later start would fail on, nor the --root folder it made, nor a server."""
    root = tmp_path / "runs" / "mlruns"
    server = subprocess.Popen([sys.executable, "-m", "mpi_train", "server", "--root", str(root), "--port",
                               str(free_port()), "--workers", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_for(lambda: (root / "mlflow.db").exists() or server.poll() is not None, 60, "the server to begin the store",
             every_s=0.05)
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) == 0 and "stopping the MLflow server" in server.stderr.read()
    assert list(tmp_path.iterdir()) == []


def test_host_sampler_names_metrics_like_mlflow_and_respects_its_interval():
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    mlflow_names = set()
    for monitor in (CPUMonitor(), DiskMonitor(), NetworkMonitor()):
        monitor.collect_metrics()
        mlflow_names |= set(monitor.aggregate_metrics())
    sample = HostSampler(every_s=1e-9).sample()["system"]
    assert set(sample) == mlflow_names
    assert 0 <= sample["cpu_utilization_percentage"] <= 100 and sample["disk_available_megabytes"] > 0
    slow = HostSampler(every_s=3600)
    assert "system" in slow.sample()  # the first sample is always taken
    assert slow.sample() == {}  # not again within the interval
    assert HostSampler(every_s=0).sample() == {}  # 0 turns sampling off


def test_batch_sender_groups_per_run_and_caps_batches_at_1000():
    calls = []

    class FakeClient:
        def log_batch(self, run_id, metrics=(), synchronous=None):
            calls.append((run_id, len(metrics)))

    sender = BatchSender(FakeClient(), every_s=3600)
    for _ in range(3):
        sender.put("parent", list(range(500)))
        sender.put("child", [1, 2])
    assert calls == []  # putting never calls the client
    sender.stop()
    assert sorted(calls) == [("child", 6), ("parent", 500), ("parent", 1000)]


def test_the_saved_models_line_names_its_store_whole_and_no_password(tmp_path, monkeypatch):
    """The line once said load_model("runs:/...") alone, which MLflow looks up in its own default ./mlflow.db."""
    from types import SimpleNamespace

    from mpi_train.tracking.saved_model import ModelSaving

    monkeypatch.chdir(tmp_path)
    def line(uri):
        return ModelSaving.loading_code(SimpleNamespace(uri=uri), "runs:/r/model")

    assert line("sqlite:///mlruns/mlflow.db") == (f'mlflow.set_tracking_uri("sqlite:///{tmp_path}/mlruns/mlflow.db"); '
                                                  f'mlflow.pytorch.load_model("runs:/r/model")')
    assert line("http://alice:s3cret@h:5000").startswith('mlflow.set_tracking_uri("http://h:5000");')
