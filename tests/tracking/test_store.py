"""One resolution of the tracking URI: the flag, else $MLFLOW_TRACKING_URI, else the embedded store."""

from mpi_train.tracking import default_store_uri, resolve_uri
from mpi_train.tracking.store import given_uri


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
    """Four processes open one new SQLite store together: MLflow creates its tables in whichever comes first, and
    the others find them made (without the store's lock, most of them failed on `table ... already exists`). MLflow's
    own lines about creating them are left out."""
    import multiprocessing

    import mlflow  # noqa: F401 - imported once, here: the openers are forked from this process

    context = multiprocessing.get_context("fork")
    start, outcomes = context.Barrier(4), context.Queue()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    openers = [context.Process(target=open_new_store, args=(uri, start, outcomes)) for _ in range(4)]
    for opener in openers:
        opener.start()
    for opener in openers:
        opener.join(120)
    assert sorted(outcomes.get(timeout=5) for _ in openers) == ["ok"] * 4
    assert "Creating initial MLflow database tables" not in capfd.readouterr().err
