"""Shared test helpers: launching real mpirun jobs of this package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_train import launcher

REPO = Path(__file__).resolve().parents[1]

MPI_ENV = {**launcher.OPEN_MPI_ENV, "PYTHONUNBUFFERED": "1"}


def mpirun(np: int, args: list[str], *, module: str = "mpi_train", timeout: float = 240,
           env: dict | None = None, cwd: Path | None = None, hostfile: Path | None = None,
           rank_prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run `python -m module args` under a real `mpirun -np N` and return the finished process.

    Without a hostfile every rank runs here (oversubscribed); with one, its slots place the ranks
    (--oversubscribe would let mpirun put them all on the first host). `rank_prefix` is a command
    each rank's python runs under.
    """
    placement = ["--hostfile", str(hostfile)] if hostfile else ["--oversubscribe"]
    command = ["mpirun", "-np", str(np), *placement, *rank_prefix, sys.executable, "-m", module, *args]
    return launcher.run(command, env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO), **(env or {})},
                        timeout=timeout, cwd=cwd or REPO)


def train(np: int, tmp_path: Path, *args: str, name: str = "summary", **kwargs) -> dict:
    """A real training job; returns its summary JSON (asserting the job succeeded)."""
    summary = tmp_path / f"{name}.json"
    result = mpirun(np, [*args, "--summary-json", str(summary)], **kwargs)
    assert result.returncode == 0, f"mpirun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return json.loads(summary.read_text())


def losses(summary: dict) -> list[float]:
    return [step["loss"] for step in summary["steps"]]


@pytest.fixture
def quick_args() -> list[str]:
    """A run of a few seconds: small synthetic MNIST-shaped data, not recorded in MLflow."""
    return ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "2", "--no-tracking"]


# --- Experiment tracking: a real MLflow server and tracked jobs, shared by the whole session. ---

def client_for(uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def job_runs(client, experiment: str, run_name: str):
    """The newest parent run called `run_name` in `experiment`, and its children ordered by rank."""
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    parents = client.search_runs([experiment_id], f"tags.`mpi_train.role` = 'job' and attributes.run_name = '{run_name}'",
                                 order_by=["attributes.start_time DESC"])
    parent = parents[0]
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    return parent, sorted(children, key=lambda c: int(c.data.tags["rank"]))


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class MlflowServer:
    """`python -m mpi_train.server` on a free port of `host`; it takes ~15 s to be up, so `uri()` waits for it."""

    def __init__(self, root: Path, host: str = "127.0.0.1"):
        self.root, self.url = root, f"http://{host}:{free_port(host)}"
        self.log = open(root / "server.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mpi_train.server", "--host", host, "--port", self.url.rsplit(":", 1)[1], "--workers", "1"],
            cwd=root, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        self.up = False

    def uri(self) -> str:
        """The server's URI, once it answers."""
        import time

        from mpi_train.tracking.probe import server_answers

        deadline = time.monotonic() + 120
        while not self.up:
            assert self.process.poll() is None, (self.root / "server.log").read_text()
            self.up = server_answers(self.url)
            if not self.up:
                assert time.monotonic() < deadline, "mlflow server did not start:\n" + (self.root / "server.log").read_text()
                time.sleep(0.5)
        return self.url

    def stop(self) -> None:
        import signal

        self.process.send_signal(signal.SIGINT)  # what Ctrl-C does: the command stops mlflow and its workers
        try:
            self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.log.close()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A tracking server on loopback, shared by the whole session."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    try:
        yield server.uri()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tracked_jobs(mlflow_server, tmp_path_factory):
    """Two finished np 2 jobs (allreduce with --save-model, gather_scatter) in the experiment `tests-compare`."""
    tmp = tmp_path_factory.mktemp("tracked")
    args = ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "2",
            "--max-steps", "8", "--experiment", "tests-compare"]
    host_port = mlflow_server.removeprefix("http://")
    return {
        # a password in the URI and a token in the environment: neither may reach the run
        "allreduce": train(2, tmp, *args, "--sync", "allreduce", "--save-model", "--tracking-uri",
                           f"http://alice:s3cret-pw@{host_port}", name="allreduce",
                           env={"MLFLOW_TRACKING_TOKEN": "s3cret-token", "MLFLOW_TRACKING_URI": ""}),
        "gather_scatter": train(2, tmp, *args, "--sync", "gather_scatter", name="gather_scatter",
                                env={"MLFLOW_TRACKING_URI": mlflow_server}),
    }
