"""The run guard: a small process outside the MPI job that records the job's end if rank 0 dies first.

Started by rank 0 as `python -c WAIT`; it reads rank 0's messages from its stdin and acts (`act`) only if that pipe
closes before rank 0 says "done".
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from .probe import server_answers
from .spool import OFFLINE_PREFIX, MetricHistory, Spool, batch_record, deliver, server_run_id
from .store import mlflow_client

LEAVE_S = 10.0  # how long rank 0 waits for the guard to leave once told the job's end is recorded
# The guard's program. Waiting on rank 0's pipe takes nothing of this package's, whose modules import torch (1.3 s of
# CPU beside every tracked job's start, and as long at a short job's end, waiting for the guard to read "done"): so it
# runs from the interpreter's command line, keeps what rank 0 sent in plain lists, and imports the rest only to act.
WAIT = """\
import json, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
setup, outcome, kept, number = None, None, [], 0
for line in sys.stdin:
    message = json.loads(line)
    if setup is None:
        setup = message
    elif message.get("done"):
        os._exit(0)
    elif "child" in message:
        setup["children"].append(message["child"])
    elif "run" in message:
        number += 1
        kept.append((number, message["run"], message["metrics"]))
    elif "handled" in message:
        kept = [batch for batch in kept if batch[0] > message["handled"]]
    else:
        outcome = message
if setup is not None:
    from mpi_train.tracking.guard import act
    sys.exit(act(setup, kept, outcome))
"""


class RunGuard:
    """A tiny process outside the MPI job that ends the runs if rank 0 dies before it could.

    mpirun follows SIGTERM with SIGKILL about 0.2 s later, too soon for the HTTP calls that
    end the runs; and SIGKILL or an out-of-memory kill gives no warning at all. So the guard
    holds a copy of every metric not yet handled by the sender, and rank 0 sends it the
    outcome before recording it itself, then says "done". If the pipe closes without "done",
    the guard sends the metrics the server lacks and ends every run still RUNNING with the
    announced outcome (KILLED if none was announced). It imports mlflow only then. If the
    server is away then, it adds all of that to the job's spool for `python -m mpi_train replay`,
    after what rank 0 spooled; if the server is back, it first sends that spool.
    """

    def __init__(self, uri: str, parent_id: str, child_ids: list[str], spool: Path | None = None, experiment: str = ""):
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WAIT], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=env, start_new_session=True,  # out of reach of mpirun's kill
        )
        self.lock = threading.Lock()  # the training loop and the sender thread both write
        self._send({"uri": uri, "parent": parent_id, "children": child_ids,
                    "spool": str(spool.resolve()) if spool else None, "experiment": experiment})

    def _send(self, message: dict) -> None:
        line = (json.dumps(message) + "\n").encode()
        with self.lock:
            try:
                self.process.stdin.write(line)
                self.process.stdin.flush()
            except (OSError, ValueError):  # the guard is gone: nothing more it can do
                pass

    def add_child(self, run_id: str) -> None:
        """A child run made after the guard started (a bench's method): ended with the others."""
        self._send({"child": run_id})

    def keep(self, run_id: str, metrics: list) -> None:
        self._send({"run": run_id, "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics]})

    def handled(self, count: int) -> None:
        """The first `count` kept batches were sent (or spooled): the guard may drop them."""
        self._send({"handled": count})

    def announce(self, status: str, tags: dict, child_statuses: list[str]) -> None:
        self._send({"status": status, "tags": tags, "child_statuses": child_statuses})

    def done(self) -> None:
        """Rank 0 recorded the job's end itself: the guard leaves, before the job does (nothing left behind)."""
        self._send({"done": True})
        try:
            self.process.stdin.close()
        except OSError:
            pass
        with contextlib.suppress(subprocess.TimeoutExpired):  # one still starting (a short job) reads it first
            self.process.wait(LEAVE_S)


def act(setup: dict, kept: list, outcome: dict | None) -> int:
    """Rank 0's pipe closed before it said "done": finish what it left. `kept`: (number, run id, metric rows) of the
    batches the sender had not handled; `outcome`: the end rank 0 announced, if it did."""
    if outcome is None:
        outcome = {"status": "KILLED", "tags": {"mpi_train.killed_by": "rank 0 ended without recording the run"},
                   "child_statuses": ["KILLED"] * len(setup["children"])}
    client = mlflow_client(setup["uri"])
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
        except Exception:  # noqa: BLE001, S110 - nobody is left to tell
            pass
    return 0


def _resend_spool(spool: Spool, client, uri: str) -> dict | None:
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

    return [batch_record(run_id, [Metric(*row) for row in rows[start:start + 1000]])
            for start in range(0, len(rows), 1000)]


def _spool_the_end(spool: Spool, uri: str, unsent: dict, tags: dict, parent_id: str, runs: list) -> None:
    """Append the metrics rank 0 left and the runs' end to the spool (the replay skips rows the server holds)."""
    for run_id, rows in unsent.items():
        for record in _metric_batches(run_id, rows):
            spool.add(record, uri)
    if tags:
        spool.add({"kind": "log_batch", "run_id": parent_id, "metrics": [], "params": {},
                   "tags": {key: str(value) for key, value in tags.items()}}, uri)
    for run_id, status in runs:
        spool.add({"kind": "set_terminated", "run_id": run_id, "status": status,
                   "end_time": int(time.time() * 1000)}, uri)


def _send_missing(client, run_id: str, rows: list) -> None:
    """Log the metrics rank 0 left unsent, leaving out rows the server already holds (as a replay does)."""
    history = MetricHistory(client)
    try:
        for record in _metric_batches(run_id, rows):
            deliver(client, record, history)
    except Exception:  # noqa: BLE001, S110 - nobody is left to tell
        pass

