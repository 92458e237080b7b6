"""Experiment tracking in MLflow: one parent run per job, one child run per rank, and only rank 0 talks to MLflow.

The other ranks' numbers reach rank 0 through the training loop's gather; rank 0
queues them and a background thread sends them in batches (`MlflowClient.log_batch`),
so the loop never waits on the network. Every run ends in a terminal status:
FINISHED; FAILED when any rank raises (a non-zero rank posts its traceback to rank 0
through the torch.distributed TCPStore, whose server lives in rank 0's process, because
rank 0 may be blocked in a collective that will never complete); KILLED on SIGTERM/SIGINT.
A small guard process outside the MPI job records the outcome if rank 0 is killed first.

System metrics, one sampler per host: each host's local rank 0 samples psutil (CPU,
memory, network, disk, named like MLflow's own system metrics) and adds the numbers to
the logged-step gather; rank 0 logs them as `system/<host>/...` through the same sender
as every other metric, so they are spooled through an outage too.

mlflow is imported only on rank 0 and only when tracking is on.
"""

from __future__ import annotations

import collections
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

from ..config import TrainConfig, redact_uri
from ..errors import UserError, folder_write_error, raised_in_collective
from .spool import (OFFLINE_PREFIX, SPOOL_DIR, MetricHistory, Spool, SpoolingClient, batch_record, deliver,
                    server_answers, server_run_id)

DEFAULT_STORE_DIR = "mlruns"  # the embedded default: SQLite store and artifacts under ./mlruns
SERVER_SCHEMES = ("http", "https")
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
PROBE_TIMEOUT_S = 5.0  # an unreachable server is reported well within 30 s, before training
# Unless the user set them: a refused connection gives up after ~3 s (MLflow's defaults, 7 retries with
# doubling back-off, take minutes), a hung server after 3 x 10 s. Writes that fail are spooled and re-sent (spool.py).
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
FLUSH_EVERY_S = 2.0  # the background sender's batching period
END_TIMEOUT_S = 20.0  # how long the final flush may take before it is given up
FAILURE_KEY, ACK_KEY = "mpi_train/failure", "mpi_train/failure_ack"
ACK_WAIT_S = 10.0  # a failing rank waits this long for rank 0 to record its failure before aborting
SECRET_WORDS = ("TOKEN", "PASSWORD", "SECRET", "KEY", "CREDENTIAL", "AUTH")
PARAMS = ("sync", "backend", "world_size", "batch_size", "batch_size_per_rank", "model", "dataset", "lr",
          "momentum", "weight_decay", "epochs", "max_steps", "seed", "hosts", "threads", "rendezvous",
          "link", "num_hosts", "ranks_per_host")


# ---------------------------------------------------------------------------------------------
# Where runs go: checked on rank 0 before any work, the outcome shared with every rank.

@dataclass(frozen=True)
class Connection:
    """A checked tracking destination on rank 0."""

    client: Any  # mlflow.MlflowClient, or for a server a SpoolingClient around one
    uri: str
    experiment_id: Optional[str]  # None when started offline (--tracking-spool): the replay creates it

    @property
    def online(self) -> bool:
        return self.experiment_id is not None


def default_store_uri() -> str:
    """The embedded store: SQLite under ./mlruns (MLflow 3 no longer accepts a folder of files)."""
    return f"sqlite:///{DEFAULT_STORE_DIR}/mlflow.db"


def check_store_dir(directory: Path, flag_hint: str) -> None:
    """`directory` must be a writable folder (created if missing): the SQLite file and artifacts live there."""
    reason = folder_write_error(directory)
    if reason:
        raise UserError(
            f"The MLflow store folder {directory.resolve()} is not a writable folder ({reason}). "
            f"The job's runs and artifacts are kept there. Make it a writable folder, run from another working "
            f"directory, {flag_hint}, or pass --no-tracking."
        ) from None


def check_uri(uri: str) -> str:
    """Reject URIs MLflow 3 cannot use, with the fix; returns the scheme."""
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as error:
        raise UserError(f"--tracking-uri {redact_uri(uri)!r} is malformed ({error}). {_URI_FORMS}") from None
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        raise UserError(
            f"--tracking-uri {redact_uri(uri)!r} names a folder of files, which MLflow 3 no longer accepts as a "
            f"tracking store. Use a SQLite file instead, e.g. --tracking-uri sqlite:///mlruns/mlflow.db, "
            f"or a tracking server."
        )
    if scheme in SERVER_SCHEMES and not parts.hostname:
        raise UserError(f"--tracking-uri {redact_uri(uri)!r} has no host. {_URI_FORMS}")
    if scheme not in SERVER_SCHEMES + DATABASE_SCHEMES + ("databricks",):
        raise UserError(f"--tracking-uri {redact_uri(uri)!r} has an unknown scheme {scheme!r}. {_URI_FORMS}")
    return scheme


_URI_FORMS = ("Give a tracking server as http://HOST:PORT (start one with `python -m mpi_train.server`), "
              "or a database such as sqlite:///mlruns/mlflow.db; the flag overrides $MLFLOW_TRACKING_URI.")


def probe_server(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Ask the server's /health endpoint, retrying briefly: a clear error now beats MLflow's minutes of retries."""
    parts = urlsplit(uri)
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=max(1.0, deadline - time.monotonic())) as response:
                if response.status == 200:
                    return
                problem = f"HTTP {response.status}"
        except urllib.error.HTTPError as error:
            problem = f"HTTP {error.code}"
        except (OSError, ValueError) as error:
            problem = str(getattr(error, "reason", None) or error)
        if time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    raise UserError(
        f"No MLflow tracking server answers at {redact_uri(uri)} (asked {url} for {timeout_s:.0f} s: {problem}). "
        f"Start one with `python -m mpi_train.server --host {parts.hostname} --port {parts.port or 5000}`, "
        f"correct --tracking-uri or $MLFLOW_TRACKING_URI, or pass --no-tracking to train without tracking."
    )


def _open(config: TrainConfig) -> Connection:
    uri = config.tracking_uri or default_store_uri()
    scheme = check_uri(uri)
    if scheme == "sqlite":
        database = urlsplit(uri).path[1:]  # sqlite:///relative/path or sqlite:////absolute/path
        if database and database != ":memory:":
            check_store_dir(Path(database).parent, "point --tracking-uri at another sqlite:/// file")
        check_store_dir(Path(DEFAULT_STORE_DIR), "point --tracking-uri at a server")  # where artifacts land
    if scheme in SERVER_SCHEMES:
        for variable, value in HTTP_LIMITS.items():  # a server that dies mid-job must not hold the job's end for minutes
            os.environ.setdefault(variable, value)
        try:
            probe_server(uri)
        except UserError as error:
            if not config.tracking_spool:
                raise UserError(f"{error} To train now and send the runs later, pass --tracking-spool.") from None
            return _offline(config, uri, error)
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri)
    if scheme in SERVER_SCHEMES:
        client = SpoolingClient(client, uri, Spool(job_spool_path()), config.experiment)
    try:
        experiment = client.get_experiment_by_name(config.experiment)
        if experiment is not None:
            return Connection(client, uri, experiment.experiment_id)
        try:
            return Connection(client, uri, client.create_experiment(config.experiment))
        except MlflowException:  # another job created it a moment ago
            return Connection(client, uri, client.get_experiment_by_name(config.experiment).experiment_id)
    except Exception as error:  # noqa: BLE001 - any store failure here is the user's setup
        raise UserError(
            f"The MLflow store at {redact_uri(uri)} could not open experiment {config.experiment!r}: "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}. Check --tracking-uri, "
            f"the server's log and its permissions, or pass --no-tracking."
        ) from None


def job_spool_path() -> Path:
    return SPOOL_DIR / f"job-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl"


def _offline(config: TrainConfig, uri: str, error: UserError) -> Connection:
    """--tracking-spool with no server: runs get local ids and everything goes to the spool."""
    from mlflow import MlflowClient

    check_store_dir(SPOOL_DIR, "run from another working directory")
    spool = Spool(job_spool_path())
    print(f"mpi_train: warning: {error.args[0].split(' Start one')[0]} Training anyway (--tracking-spool): the runs "
          f"are kept in {spool.path}; send them with `python -m mpi_train.replay --tracking-uri {redact_uri(uri)}`.",
          file=sys.stderr, flush=True)
    return Connection(SpoolingClient(MlflowClient(tracking_uri=uri), uri, spool, config.experiment, online=False), uri, None)


def connect(config: TrainConfig, cluster) -> Optional[Connection]:
    """Check the tracking destination on rank 0 before any work; collective (every rank fails together)."""
    if config.no_tracking:
        return None
    connection, outcome = None, None
    if cluster.info.is_main:
        try:
            connection = _open(config)
        except UserError as error:
            outcome = str(error)
    cluster.agree(outcome, "Experiment tracking is not available")
    return connection


def job_metrics(summary: dict, global_batch: int) -> dict:
    """The whole-job figures of a finished job's summary, under the parent run's metric names."""
    means, steps = summary["mean_times"], summary["total_steps"]
    return {
        **{f"mean_{key}": value for key, value in means.items()},
        **{f"total_{key}": value * steps for key, value in means.items()},
        "sync_share": means["sync_time_s"] / means["step_time_s"] if means["step_time_s"] else 0.0,
        "total_steps": steps, "wall_time_s": summary["wall_time_s"],
        "mean_throughput_samples_per_s": global_batch / means["step_time_s"] if means["step_time_s"] else 0.0,
        **({"final_loss": summary["final_loss"]} if summary["final_loss"] is not None else {}),
        **({"predicted_sync_time_s": summary["predicted_sync_time_s"]} if "predicted_sync_time_s" in summary else {}),
    }


# ---------------------------------------------------------------------------------------------
# What every rank holds: a no-op tracker, the failure poster (ranks > 0), the MLflow tracker (rank 0).

class NullTracker:
    """Tracking off, or nothing for this rank to do; also the interface the others implement."""

    parent_id: Optional[str] = None  # the job's MLflow run, stored in checkpoints so a resumed job can link to it
    sampler: Optional[HostSampler] = None  # set on the first rank of each host when system metrics are on

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace) -> bool:
        return False

    def host_sample(self) -> dict:
        """What this rank adds to the logged-step gather (system metrics of its host, if it samples them)."""
        return self.sampler.sample() if self.sampler else {}

    def console(self, line: str) -> None: ...
    def log_step(self, epoch: int, step: int, loss: float, times: dict, throughput: float, per_rank: list[dict]) -> None: ...
    def log_epoch(self, epoch: int, test_loss: float, test_accuracy: float, epoch_time_s: float) -> None: ...
    def finish(self, summary: dict) -> None: ...
    def save_weights(self, model) -> None: ...


class HostSampler:
    """psutil numbers for one host, named like MLflow's system metrics; sampled at most every `every_s`."""

    def __init__(self, every_s: float):
        import psutil

        self.psutil, self.every_s, self.last = psutil, every_s, None
        self.net0 = psutil.net_io_counters()
        psutil.cpu_percent(interval=None)  # starts the CPU-time window

    def sample(self) -> dict:
        now = time.monotonic()
        if not self.every_s or (self.last is not None and now - self.last < self.every_s):
            return {}
        self.last = now
        memory, net, disk = self.psutil.virtual_memory(), self.psutil.net_io_counters(), self.psutil.disk_usage("/")
        return {"system": {
            "cpu_utilization_percentage": self.psutil.cpu_percent(interval=None),
            "system_memory_usage_megabytes": (memory.total - memory.available) / 1e6,
            "system_memory_usage_percentage": memory.percent,
            "network_receive_megabytes": (net.bytes_recv - self.net0.bytes_recv) / 1e6,
            "network_transmit_megabytes": (net.bytes_sent - self.net0.bytes_sent) / 1e6,
            "disk_usage_percentage": disk.percent,
            "disk_usage_megabytes": disk.used / 1e6,
            "disk_available_megabytes": disk.free / 1e6,
        }}


class RankTracker(NullTracker):
    """A rank other than 0: samples its host if it is that host's first rank, and reports its own failure."""

    def __init__(self, store, info, sampler: Optional[HostSampler]):
        self.store, self.info, self.sampler = store, info, sampler

    def __exit__(self, kind, error, trace) -> bool:
        if error is None or isinstance(error, KeyboardInterrupt) or (isinstance(error, UserError) and error.collective):
            return False  # a clean end, a signal (rank 0 records those), or an error rank 0 raised too
        failure = {"rank": self.info.rank, "host": self.info.host,
                   "traceback": "".join(traceback.format_exception(kind, error, trace))}
        try:  # rank 0's watcher ends the run FAILED and acknowledges; then cli.guarded aborts the job
            self.store.set(FAILURE_KEY, json.dumps(failure))
            self.store.wait([ACK_KEY], timedelta(seconds=ACK_WAIT_S))
        except Exception:  # noqa: BLE001 - rank 0 unreachable or slow: aborting matters more
            pass
        return False


class BatchSender:
    """A thread that sends queued metrics every few seconds with one log_batch per run (≤1000 per call).

    After each flush it calls `on_handled(n)` with the number of `put` calls handled so far, so
    the run guard can forget what no longer needs its copy.
    """

    def __init__(self, client, every_s: float = FLUSH_EVERY_S, on_handled=lambda handled: None):
        self.client, self.every_s, self.on_handled = client, every_s, on_handled
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.handled = 0
        self.stopping = threading.Event()
        self.error: Optional[str] = None
        self.thread = threading.Thread(target=self._run, name="mlflow-batch-sender", daemon=True)
        self.thread.start()

    def put(self, run_id: str, metrics: list) -> None:
        self.queue.put((run_id, metrics))  # never blocks

    def _run(self) -> None:
        while not self.stopping.wait(self.every_s):
            self.flush()
        self.flush()

    def flush(self) -> None:
        if hasattr(self.client, "retry"):  # re-send a spool once the server is back, even with nothing new to send
            self.client.retry()
        by_run: dict[str, list] = {}
        taken = 0
        while True:
            try:
                run_id, metrics = self.queue.get_nowait()
            except queue.Empty:
                break
            by_run.setdefault(run_id, []).extend(metrics)
            taken += 1
        for run_id, metrics in by_run.items():
            for start in range(0, len(metrics), 1000):
                try:
                    self.client.log_batch(run_id, metrics=metrics[start:start + 1000], synchronous=True)
                except Exception as error:  # noqa: BLE001 - tracking must never stop training
                    if self.error is None:
                        self.error = f"{type(error).__name__}: {error}"
                        print(f"mpi_train: warning: MLflow did not accept metrics ({self.error}); "
                              f"training continues.", file=sys.stderr)
        if taken:
            self.handled += taken
            self.on_handled(self.handled)

    def stop(self, timeout_s: float = END_TIMEOUT_S) -> None:
        self.stopping.set()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout_s)


class MlflowTracker(NullTracker):
    """Rank 0: the job's parent run and one child run per rank; ends them in exactly one terminal status."""

    def __init__(self, connection: Connection, config: TrainConfig, cluster, job: dict, ranks: list[dict]):
        from mlflow.entities import Param

        self.client, self.cluster, self.config = connection.client, cluster, config
        self.info, self.hosts = cluster.info, list(cluster.hosts)
        self.lock = threading.Lock()
        self.status: Optional[str] = None
        self.lines: list[str] = []
        self.loop_time_s = 0.0  # time the training loop spent in this tracker: the overhead it pays
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()
        self.wakeup: Optional[tuple[int, int]] = None

        environment = describe_environment(cluster)
        params = {**{k: v for k, v in config.as_dict().items() if k in PARAMS}, **{k: v for k, v in job.items() if k in PARAMS}}
        params["hosts"] = ",".join(sorted(set(self.hosts)))
        tags = {"mpi_train.role": "job", "torch_version": environment["torch"], "mpi4py_version": environment["mpi4py"],
                "mpi_library_version": environment["mpi_library"].splitlines()[0] if environment["mpi_library"] else "unknown",
                "mlflow_version": environment["mlflow"], "hosts": params["hosts"]}
        if environment["git_commit"]:
            tags["mlflow.source.git.commit"] = environment["git_commit"]
        if job.get("resumed_from"):  # the run this job continues, and where
            resumed = job["resumed_from"]
            tags.update({"resumed_from": self._continued_run(connection, resumed["run_id"]),
                         "resumed_from_step": str(resumed["step"]), "resumed_from_checkpoint": resumed["checkpoint"]})
        parent = self.client.create_run(connection.experiment_id, run_name=config.default_run_name(self.info.world_size), tags=tags)
        self.parent_id, self.child_ids = parent.info.run_id, []
        try:
            self.client.log_batch(self.parent_id, params=[Param(k, str(v)) for k, v in sorted(params.items())], synchronous=True)
            for who in ranks:
                child = self.client.create_run(connection.experiment_id, run_name=f"rank{who['rank']}", tags={
                    "mlflow.parentRunId": self.parent_id, "mpi_train.role": "rank",
                    **{key: str(who[key]) for key in ("rank", "local_rank", "host", "pid")}})
                self.child_ids.append(child.info.run_id)
                self.client.log_batch(child.info.run_id, params=[Param("seed", str(config.seed))], synchronous=True)
            self.client.log_dict(self.parent_id, config.as_dict(), "config.json")
            self.client.log_dict(self.parent_id, environment, "environment.json")
        except BaseException:  # never leave a half-made job RUNNING
            for run_id in [*self.child_ids, self.parent_id]:
                try:
                    self.client.set_terminated(run_id, "FAILED")
                except Exception:  # noqa: BLE001 - the original error matters more
                    pass
            raise
        self.uri = connection.uri
        spool = self.client.spool.path if isinstance(self.client, SpoolingClient) else None
        self.guard = RunGuard(connection.uri, self.parent_id, self.child_ids, spool, config.experiment)
        self.sender = BatchSender(self.client, on_handled=self.guard.handled)
        self.sampler = HostSampler(config.system_metrics_every) if config.system_metrics_every else None

    def _continued_run(self, connection: Connection, run_id: Optional[str]) -> str:
        """The resumed checkpoint's run, by the server's id once a job that trained offline has been replayed."""
        if not run_id:
            return "unknown (the checkpoint's job was not tracked)"
        if not run_id.startswith(OFFLINE_PREFIX) or not connection.online:
            return run_id
        try:
            found = server_run_id(self.client, connection.experiment_id, run_id)
        except Exception:  # noqa: BLE001 - a lookup failure must not stop the job
            found = None
        return found or f"{run_id} (its job trained offline and has not been replayed yet)"

    # -- the training loop's calls: queue only, never the network --------------------------------------

    def _metrics(self, values: dict, step: int) -> list:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        return [Metric(key, float(value), now, step) for key, value in values.items() if isinstance(value, (int, float))]

    def _put(self, run_id: str, metrics: list) -> None:
        """Queue metrics for the sender, and give the guard a copy in case this process dies first."""
        self.guard.keep(run_id, metrics)
        self.sender.put(run_id, metrics)

    def console(self, line: str) -> None:
        self.lines.append(line)

    def log_step(self, epoch, step, loss, times, throughput, per_rank) -> None:
        started = time.perf_counter()
        self._put(self.parent_id, self._metrics({
            "loss": loss, "step_time_s": times["step_time_s"], "compute_time_s": times["compute_time_s"],
            "sync_time_s": times["sync_time_s"], "throughput_samples_per_s": throughput,
            **{k: times[k] for k in ("predicted_sync_time_s",) if k in times}}, step))
        for rank, record in enumerate(per_rank):
            self._put(self.child_ids[rank], self._metrics({k: v for k, v in record.items() if k != "system"}, step))
            if record.get("system"):
                host = self.hosts[rank]
                self._put(self.parent_id, self._metrics({f"system/{host}/{k}": v for k, v in record["system"].items()}, step))
        self.loop_time_s += time.perf_counter() - started

    def log_epoch(self, epoch, test_loss, test_accuracy, epoch_time_s) -> None:
        self._put(self.parent_id, self._metrics(
            {"test_loss": test_loss, "test_accuracy": test_accuracy, "epoch_time_s": epoch_time_s}, epoch))

    def finish(self, summary: dict) -> None:
        means, steps = summary["mean_times"], summary["total_steps"]
        step_time_total = means["step_time_s"] * steps
        self._put(self.parent_id, self._metrics({
            **job_metrics(summary, self.config.batch_size),
            "tracking_loop_time_s": self.loop_time_s,
            "tracking_share": self.loop_time_s / step_time_total if step_time_total else 0.0,
        }, steps))
        for rank, rank_means in enumerate(summary["per_rank_mean_times"]):
            self._put(self.child_ids[rank], self._metrics({f"mean_{k}": v for k, v in rank_means.items()}, steps))
        self.client.log_dict(self.parent_id, summary, "summary.json")

    def save_weights(self, model) -> None:
        import torch

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "state_dict.pt"
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)
            self.client.log_artifact(self.parent_id, str(path), "model")

    # -- lifetime: started by `with`, ended once -------------------------------------------------------

    def __enter__(self):
        if self.info.world_size > 1 and self.cluster.store is not None:
            self._thread(self._watch_failures, "mpi_train-failure-watch")
        if threading.current_thread() is threading.main_thread():
            self._catch_signals()
        return self

    def __exit__(self, kind, error, trace) -> bool:
        if error is None:
            self.end("FINISHED")
        elif isinstance(error, KeyboardInterrupt):
            self.end("KILLED", tags={"mpi_train.killed_by": "KeyboardInterrupt"})
        else:
            rank, host = self.info.rank, self.info.host
            text = "".join(traceback.format_exception(kind, error, trace))
            if raised_in_collective(error):  # rank 0 only saw a peer's failure: blame the rank that was behind
                behind = self.cluster.laggards()
                rank, host = (behind[0], self.cluster.hosts[behind[0]]) if behind else ("unknown", "unknown")
                text = f"A collective failed on rank {self.info.rank} ({self.info.host}); rank {rank} was behind.\n{text}"
            self.end("FAILED", failure={"rank": rank, "host": host, "traceback": text})
        self._release_signals()
        self._report_spool()
        return False

    def _report_spool(self, try_again: bool = True) -> None:
        """One last try at sending what an outage spooled (unless there is no time for one: a signal); if the
        server is still away, say how to send it later."""
        if not hasattr(self.client, "retry") or (try_again and self.client.retry(now=True)) or not self.client.pending():
            return
        uri = redact_uri(self.uri)
        print(f"mpi_train: warning: the MLflow server at {uri} is still unreachable; {self.client.pending()} "
              f"write(s), the runs' end included, are kept in {self.client.spool.path}. Send them with "
              f"`python -m mpi_train.replay --tracking-uri {uri}` once it is up.", file=sys.stderr, flush=True)

    def end(self, status: str, tags: Optional[dict] = None, failure: Optional[dict] = None) -> bool:
        """End the parent and child runs in `status` (the first call wins); True if this call ended them.

        The outcome goes to the guard process first, so it is recorded even if mpirun kills
        this process midway (it follows SIGTERM with SIGKILL within a fraction of a second).
        """
        with self.lock:
            if self.status is not None:
                return False
            self.status = status
        tags = dict(tags or {})
        failed_rank = failure["rank"] if failure else None
        if failure:
            last_line = failure["traceback"].strip().splitlines()[-1] if failure["traceback"].strip() else ""
            tags.update({"mpi_train.failed_rank": str(failed_rank), "mpi_train.failed_host": failure["host"],
                         "mpi_train.error": last_line[:5000]})
            self.lines.append(f"rank {failed_rank} on {failure['host']} failed:\n{failure['traceback']}")
        child_statuses = [status if status != "FAILED" or rank == failed_rank else "KILLED" for rank in range(len(self.child_ids))]
        self.guard.announce(status, tags, child_statuses)
        self.stop.set()
        try:
            if status == "FINISHED":  # nothing is pressing: the last metrics first, then the status
                self.sender.stop()
            from mlflow.entities import RunTag

            if tags:
                self.client.log_batch(self.parent_id, tags=[RunTag(k, str(v)) for k, v in tags.items()], synchronous=True)
            for child_id, child_status in zip(self.child_ids, child_statuses):
                self.client.set_terminated(child_id, child_status)
            self.client.set_terminated(self.parent_id, status)
            if failure:
                self.client.log_text(self.parent_id, failure["traceback"], f"failure/traceback_rank{failed_rank}.txt")
            self.client.log_text(self.parent_id, "\n".join(self.lines) + "\n", "console.log")
            self.sender.stop()
        except Exception as error:  # noqa: BLE001 - say so; the job's own outcome matters more
            print(f"mpi_train: warning: could not record the MLflow run as {status}: {error}", file=sys.stderr)
        self.guard.done()
        return True

    def _thread(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _watch_failures(self) -> None:
        """Poll the store for a failure posted by another rank (rank 0 itself may be stuck in a collective)."""
        store = self.cluster.store
        while not self.stop.wait(0.25):
            try:
                if not store.check([FAILURE_KEY]):
                    continue
                failure = json.loads(store.get(FAILURE_KEY))
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending anyway
                return
            self.end("FAILED", failure=failure)
            store.set(ACK_KEY, "1")
            return

    def _catch_signals(self) -> None:
        """SIGTERM/SIGINT end the runs KILLED from a helper thread: the main thread may sit in C code for minutes.

        Python's C-level handler writes the signal number to a wakeup pipe from whatever thread
        receives it; the helper reads it, ends the runs and aborts the MPI job.
        """
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self.wakeup = (read_fd, write_fd, signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False))
        self.old_handlers = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
        self._thread(self._wait_for_signal, "mpi_train-signal-watch")

    def _wait_for_signal(self) -> None:
        read_fd = self.wakeup[0]
        while True:
            try:
                received = os.read(read_fd, 1)
            except OSError:
                return
            if not received or received[0] == 0:  # closed, or the stop byte from _release_signals
                return
            number = received[0]
            if number not in (signal.SIGTERM, signal.SIGINT):
                continue
            name = signal.Signals(number).name
            if self.end("KILLED", tags={"mpi_train.killed_by": name}):
                print(f"mpi_train: {name} received; run recorded as KILLED, stopping every rank.", file=sys.stderr)
                self._report_spool(try_again=False)  # mpirun's SIGKILL follows within a second: no time to wait on the server
            self.cluster.abort(128 + number)

    def _release_signals(self) -> None:
        if not self.wakeup:
            return
        read_fd, write_fd, old_fd = self.wakeup
        signal.set_wakeup_fd(old_fd)
        for sig, handler in self.old_handlers.items():
            signal.signal(sig, handler)
        os.write(write_fd, b"\0")
        self.wakeup = None


class RunGuard:
    """A tiny process outside the MPI job that ends the runs if rank 0 dies before it could.

    mpirun follows SIGTERM with SIGKILL about 0.2 s later, too soon for the HTTP calls that
    end the runs; and SIGKILL or an out-of-memory kill gives no warning at all. So the guard
    holds a copy of every metric not yet handled by the sender, and rank 0 sends it the
    outcome before recording it itself, then says "done". If the pipe closes without "done",
    the guard sends the metrics the server lacks and ends every run still RUNNING with the
    announced outcome (KILLED if none was announced). It imports mlflow only then. If the
    server is away then, it adds all of that to the job's spool for `python -m mpi_train.replay`,
    after what rank 0 spooled; if the server is back, it first sends that spool.
    """

    def __init__(self, uri: str, parent_id: str, child_ids: list[str], spool: Optional[Path] = None, experiment: str = ""):
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mpi_train.tracking"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=env, start_new_session=True,  # out of reach of mpirun's kill
        )
        self.lock = threading.Lock()  # the training loop and the sender thread both write
        self._send({"uri": uri, "parent": parent_id, "children": child_ids, "spool": str(spool.resolve()) if spool else None,
                    "experiment": experiment})

    def _send(self, message: dict) -> None:
        line = (json.dumps(message) + "\n").encode()
        with self.lock:
            try:
                self.process.stdin.write(line)
                self.process.stdin.flush()
            except (OSError, ValueError):  # the guard is gone: nothing more it can do
                pass

    def keep(self, run_id: str, metrics: list) -> None:
        self._send({"run": run_id, "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics]})

    def handled(self, count: int) -> None:
        """The first `count` kept batches were sent (or spooled): the guard may drop them."""
        self._send({"handled": count})

    def announce(self, status: str, tags: dict, child_statuses: list[str]) -> None:
        self._send({"status": status, "tags": tags, "child_statuses": child_statuses})

    def done(self) -> None:
        self._send({"done": True})
        try:
            self.process.stdin.close()
        except OSError:
            pass


def _guard_main() -> int:
    """The guard process (see RunGuard): wait for rank 0's pipe to close, then finish what it left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup, outcome = None, None
    kept: collections.deque = collections.deque()  # (number, run id, rows) not yet handled by the sender
    number = 0
    for line in sys.stdin:
        message = json.loads(line)
        if setup is None:
            setup = message
        elif message.get("done"):
            return 0
        elif "run" in message:
            number += 1
            kept.append((number, message["run"], message["metrics"]))
        elif "handled" in message:
            while kept and kept[0][0] <= message["handled"]:
                kept.popleft()
        else:
            outcome = message
    if setup is None:
        return 0
    if outcome is None:
        outcome = {"status": "KILLED", "tags": {"mpi_train.killed_by": "rank 0 ended without recording the run"},
                   "child_statuses": ["KILLED"] * len(setup["children"])}
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=setup["uri"])
    unsent: dict[str, list] = {}
    for _, run_id, rows in kept:
        unsent.setdefault(run_id, []).extend(rows)
    runs = [*zip(setup["children"], outcome["child_statuses"]), (setup["parent"], outcome["status"])]
    spool = Spool(Path(setup["spool"])) if setup.get("spool") else None
    if spool is not None:
        ids = _resend_spool(spool, client, setup["uri"])
        if ids is None:  # the server is away: the replay finishes the job's record
            _spool_the_end(spool, setup["uri"], unsent, outcome["tags"], setup["parent"], runs)
            return 0
        ids = {**_replayed_runs(client, setup), **ids}
        unsent = {ids.get(run_id, run_id): rows for run_id, rows in unsent.items()}
        runs = [(ids.get(run_id, run_id), status) for run_id, status in runs]
        setup["parent"] = ids.get(setup["parent"], setup["parent"])
    for run_id, rows in unsent.items():
        _send_missing(client, run_id, rows)
    for run_id, status in runs:
        try:
            if client.get_run(run_id).info.status == "RUNNING":
                if run_id == setup["parent"]:
                    for key, value in outcome["tags"].items():
                        client.set_tag(run_id, key, str(value))
                client.set_terminated(run_id, status)
        except Exception:  # noqa: BLE001 - nobody is left to tell
            pass
    return 0


def _resend_spool(spool: Spool, client, uri: str) -> Optional[dict]:
    """Send what rank 0 spooled, if the server answers; the local -> server run ids, or None while it is away."""
    if not server_answers(uri):
        return None
    try:
        return spool.replay(client, uri, warn=lambda message: None)[1]
    except Exception:  # noqa: BLE001 - it went away meanwhile: what was sent is acknowledged
        return None


def _replayed_runs(client, setup: dict) -> dict:
    """Runs the job created offline and sent itself once the server was back: local id -> the server's id."""
    local = [run_id for run_id in (setup["parent"], *setup["children"]) if run_id.startswith(OFFLINE_PREFIX)]
    if not local:
        return {}
    try:
        experiment_id = client.get_experiment_by_name(setup["experiment"]).experiment_id
        return {run_id: found for run_id in local if (found := server_run_id(client, experiment_id, run_id))}
    except Exception:  # noqa: BLE001 - nobody is left to tell
        return {}


def _metric_batches(run_id: str, rows: list) -> list[dict]:
    """The guard's kept rows (key, value, timestamp, step) as log_batch records of at most 1000 metrics."""
    from mlflow.entities import Metric

    return [batch_record(run_id, [Metric(*row) for row in rows[start:start + 1000]]) for start in range(0, len(rows), 1000)]


def _spool_the_end(spool: Spool, uri: str, unsent: dict, tags: dict, parent_id: str, runs: list) -> None:
    """Append the metrics rank 0 left and the runs' end to the spool (the replay skips rows the server holds)."""
    for run_id, rows in unsent.items():
        for record in _metric_batches(run_id, rows):
            spool.add(record, uri)
    if tags:
        spool.add({"kind": "log_batch", "run_id": parent_id, "metrics": [], "params": {},
                   "tags": {key: str(value) for key, value in tags.items()}}, uri)
    for run_id, status in runs:
        spool.add({"kind": "set_terminated", "run_id": run_id, "status": status, "end_time": int(time.time() * 1000)}, uri)


def _send_missing(client, run_id: str, rows: list) -> None:
    """Log the metrics rank 0 left unsent, leaving out rows the server already holds (as a replay does)."""
    history = MetricHistory(client)
    try:
        for record in _metric_batches(run_id, rows):
            deliver(client, record, history)
    except Exception:  # noqa: BLE001 - nobody is left to tell
        pass


def start(connection: Optional[Connection], config: TrainConfig, cluster, job: dict) -> NullTracker:
    """The tracker for this rank; collective (rank 0 learns each rank's identity for its child run)."""
    if config.no_tracking:
        return NullTracker()
    info = cluster.info
    ranks = cluster.gather({"rank": info.rank, "local_rank": info.local_rank, "host": info.host, "pid": os.getpid()})
    if info.is_main:
        return MlflowTracker(connection, config, cluster, job, ranks)
    samples_host = info.local_rank == 0 and config.system_metrics_every > 0
    return RankTracker(cluster.store, info, HostSampler(config.system_metrics_every) if samples_host else None)


# ---------------------------------------------------------------------------------------------

def git_commit() -> Optional[str]:
    """The project's commit (with `-dirty` if tracked files changed), or None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if commit.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def describe_environment(cluster) -> dict:
    """Versions, the job's hosts as a hostfile, the MPI library and launcher settings (no secrets)."""
    import mlflow
    import mpi4py
    import torch

    try:
        from mpi4py import MPI

        library = MPI.Get_library_version().replace("\0", "").strip()
    except Exception:  # noqa: BLE001
        library = ""
    slots: dict[str, int] = {}
    for host in cluster.hosts:
        slots[host] = slots.get(host, 0) + 1
    launcher = {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_", "OMPI_COMM_WORLD_SIZE", "MASTER_ADDR", "GLOO_SOCKET_IFNAME"))
                and not any(word in k.upper() for word in SECRET_WORDS)}
    return {
        "python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
        "mpi4py": mpi4py.__version__, "mlflow": mlflow.__version__, "mpi_library": library,
        "git_commit": git_commit(), "world_size": cluster.info.world_size, "hosts_by_rank": list(cluster.hosts),
        "hostfile": "".join(f"{host} slots={n}\n" for host, n in slots.items()), "launcher_env": launcher,
    }


if __name__ == "__main__":
    sys.exit(_guard_main())
