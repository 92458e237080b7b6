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

mlflow is imported only on rank 0 and only when tracking is on. This module is the face
(connect, start); store.py, probe.py, tracker.py, runs.py (with run_facts.py, summary_metrics.py,
attempts.py and saved_model.py), sender.py, sampler.py, guard.py and signals.py hold the parts, spool.py,
replay.py and server.py the outage path and commands.
"""

from __future__ import annotations

import os

from ..config import JobInfo, TrainConfig, default_store_uri, redact_uri, resolve_uri
from ..errors import UserError
from .probe import ServerUnreachable, probe_server, server_answers
from .runs import MlflowTracker
from .sampler import HostSampler
from .store import (
    DEFAULT_STORE_DIR,
    Connection,
    check_api,
    check_store_dir,
    check_store_exists,
    check_uri,
    mlflow_client,
    open_store,
)
from .store_writes import store_said
from .summary_metrics import job_metrics
from .tracker import NullTracker, RankTracker

__all__ = [
    "DEFAULT_STORE_DIR",
    "Connection",
    "NullTracker",
    "ServerUnreachable",
    "check_api",
    "check_store_dir",
    "check_store_exists",
    "check_uri",
    "connect",
    "default_store_uri",
    "job_metrics",
    "mlflow_client",
    "probe_server",
    "resolve_uri",
    "server_answers",
    "start",
]


def connect(config: TrainConfig, cluster) -> Connection | None:
    """Check the tracking destination on rank 0 before any work; collective (every rank fails together)."""
    if config.no_tracking:
        return None
    connection, outcome = None, None
    if cluster.info.is_main:
        try:
            connection = open_store(config)
        except UserError as error:
            outcome = str(error)
    cluster.agree(outcome, "Experiment tracking is not available")
    return connection


def start(connection: Connection | None, config: TrainConfig, cluster, job: JobInfo, preemption=None) -> NullTracker:
    """The tracker for this rank; collective (rank 0 learns each rank's identity for its child run). `preemption`:
    the job's (preemption.Preemption), which runs the tracker's SIGTERM handling late, or not at all, when SIGTERM
    stops the job at a step boundary."""
    if config.no_tracking:
        return NullTracker()
    info = cluster.info
    ranks = cluster.gather({"rank": info.rank, "local_rank": info.local_rank, "host": info.host, "pid": os.getpid()})
    if info.is_main:
        from mlflow.exceptions import MlflowException

        try:
            return MlflowTracker(connection=connection, config=config, cluster=cluster, job=job, ranks=ranks,
                                 preemption=preemption)
        except (MlflowException, OSError) as error:  # the store found the experiment, but takes no run: rank 0's alone
            raise UserError(f"the MLflow store at {redact_uri(connection.uri)} could not create the job's runs "
                            f"({store_said(error)}). Free space on its disk (or make it writable), point "
                            f"--tracking-uri at another store, or pass --no-tracking. Nothing was trained.",
                            collective=False) from None
    samples_host = info.local_rank == 0 and config.system_metrics_every > 0
    return RankTracker(cluster.store, info, HostSampler(config.system_metrics_every) if samples_host else None,
                       signalled_together=cluster.environment.name != "mpi",
                       cut_off=lambda: cluster.liveness.cut_off_s(), preemption=preemption)
