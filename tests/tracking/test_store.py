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
