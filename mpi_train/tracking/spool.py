"""Tracking that survives an outage of the MLflow server: nothing rank 0 logs is lost, nothing is logged twice.

After start-up every write rank 0 makes to MLflow goes through `SpoolingClient`. While
the server answers, writes pass straight through. When one fails and the server's
/health does not answer either, the write, and every later one, is appended to a spool
file instead, in order: `mlruns/spool/<job>.jsonl`, one JSON record per call (run id,
metrics with step and timestamp, params, tags; or a run's end status, or a text
artifact). Every few seconds the logging path asks /health again (bounded by
OUTAGE_PROBE_S, probe.py) and, once the server is back, re-sends the spool in order, then
carries on directly. Training never waits for this: metrics are sent from the batch
sender's thread, and while the server is known to be down a write costs one append.

Idempotence. MLflow keeps metrics as (key, step, timestamp, value) rows, so sending a
batch twice would duplicate them. Each record carries an id; once the server has
taken it, the id is appended to `<job>.jsonl.acked`, and re-sends skip acknowledged
records. A write can also reach the server while its reply is lost (a timeout, the
server dying mid-request); so before re-sending metrics, the rows already on the
server for those keys are fetched and any identical row is left out.

`python -m mpi_train replay` sends whatever a job could not (the job ended before the
server came back, or it was started with --tracking-spool while the server was down) and
deletes the spool only when all of it was taken.

Damage. A crash or a full disk mid-append cuts a line short: such a line holds no whole
record and is passed over, by number and byte offset (`read_lines`), so that every intact
record is still sent; an append first ends a cut last line, so the new record stays whole.

With --tracking-spool a job may also start while the server is unreachable: its runs
are created with local ids (`offline-...`), which the replay maps to the ids the server
assigns (the mapping is kept in the .acked file, so an interrupted replay resumes).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..config import redact_uri
from ..files import append_private
from .probe import server_answers

SPOOL_DIR = Path("mlruns") / "spool"
PROBE_EVERY_S = 3.0  # how often the logging path checks whether the server is back
OFFLINE_PREFIX = "offline-"
# a replayed run keeps its local id here, so a checkpoint naming it can be traced
OFFLINE_ID_TAG = "mpi_train.offline_id"
DAMAGED_SUFFIX = ".damaged"  # a spool with damaged lines, set aside once everything intact in it was sent
# MLflow's words for an HTTP answer that is not its own JSON: which request, and the status
FOREIGN_ANSWER = re.compile(r"API request to endpoint (\S+) failed with error code (\d+) != 200")


def server_run_id(client, experiment_id: str, run_id: str | None) -> str | None:
    """The server's id for `run_id`: itself, or for a local id the replayed run that carries it (None before the
    replay)."""
    if not run_id or not run_id.startswith(OFFLINE_PREFIX):
        return run_id
    found = client.search_runs([experiment_id], f"tags.`{OFFLINE_ID_TAG}` = '{run_id}'", max_results=1)
    return found[0].info.run_id if found else None


def refused(error: BaseException, uri: str) -> bool:
    """True if the server took a write and said no, so sending it again cannot help; False for an outage.

    An outage is a server that does not answer /health, or one that failed on its side
    (5xx, 429 after MLflow's own retries; MLflow reports a lost connection as 500 too):
    those writes are kept and sent again. MLflow's own 4xx (a deleted run, a changed param) is final. An answer
    that is not MLflow's (a login wall's 401 or 403, another server's 404 page) refuses every write alike, not this
    one: those are kept too, for a replay with the credentials or the address that reaches MLflow.
    """
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException):
        status = error.get_http_status_code()
        if status >= 500 or status == 429 or FOREIGN_ANSWER.search(str(error)):
            return False
    return server_answers(uri)


def first_line(error: BaseException) -> str:
    """`Type: what it said`, in a line; a request that timed out as such, rather than urllib3's retry report."""
    text = str(error)
    if "Read timed out" in text or "ReadTimeoutError" in text:
        asked = re.search(r"API request to (\S+)", text)
        return (f"{type(error).__name__}: {f'API request to {asked.group(1)} ' if asked else ''}got no answer within "
                f"{os.environ.get('MLFLOW_HTTP_REQUEST_TIMEOUT', '120')} s")
    return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"


# ---------------------------------------------------------------------------------------------
# Records: plain JSON, so a spool can be read, replayed or inspected anywhere.

def batch_record(run_id: str, metrics: Iterable = (), params: Iterable = (), tags: Iterable = ()) -> dict:
    return {"kind": "log_batch", "run_id": run_id,
            "metrics": [{"key": m.key, "value": m.value, "timestamp": m.timestamp, "step": m.step} for m in metrics],
            "params": {p.key: p.value for p in params}, "tags": {t.key: t.value for t in tags}}


def _map_ids(record: dict, ids: dict) -> dict:
    """`record` with local run ids replaced by the server's (in run_id and in tag values such as the parent id)."""
    if not ids:
        return record
    mapped = dict(record)
    if mapped.get("run_id") in ids:
        mapped["run_id"] = ids[mapped["run_id"]]
    if mapped.get("tags"):
        mapped["tags"] = {k: ids.get(v, v) for k, v in mapped["tags"].items()}
    return mapped


class MetricHistory:
    """The metric rows already on the server, fetched once per (run, key) and kept up to date as we send."""

    def __init__(self, client):
        self.client, self.rows = client, {}

    def missing(self, run_id: str, metrics: list[dict]) -> list[dict]:
        keep = []
        for metric in metrics:
            rows = self._rows(run_id, metric["key"])
            row = (metric["step"], metric["timestamp"], float(metric["value"]))
            if row not in rows:
                keep.append(metric)
                rows.add(row)
        return keep

    def _rows(self, run_id: str, key: str) -> set:
        if (run_id, key) not in self.rows:
            self.rows[run_id, key] = {(m.step, m.timestamp, float(m.value))
                                      for m in self.client.get_metric_history(run_id, key)}
        return self.rows[run_id, key]


# what each kind of record holds besides its id and kind (deliver reads them)
RECORD_KEYS = {"create_run": ("local_id", "experiment", "start_time", "tags", "run_name"),
               "log_batch": ("run_id", "metrics", "params", "tags"),
               "set_terminated": ("run_id", "status", "end_time"),
               "log_text": ("run_id", "text", "artifact_file"),
               "log_artifact": ("run_id", "local_path", "artifact_path")}


def unreadable_record(records: list[dict]) -> str | None:
    """Where the first record this version cannot send is, and why (a spool of another version, or edited by
    hand), else None: found before anything is sent, so that no run is left half made."""
    for number, record in enumerate(records, 1):
        keys = RECORD_KEYS.get(record["kind"])
        missing = [key for key in keys or () if key not in record]
        if keys is None or missing:
            why = (f"its kind {record['kind']!r} is none this version writes" if keys is None else
                   f"its {record['kind']} lacks {', '.join(missing)}")
            return f"write {number} of {len(records)} ({why})"
    return None


def deliver(client, record: dict, history: MetricHistory | None = None) -> str | None:
    """Send one record; with `history`, metrics the server already holds are left out. Returns a created run's id."""
    from mlflow.entities import Metric, Param, RunTag

    kind, run_id = record["kind"], record.get("run_id")
    if kind == "create_run":
        experiment = client.get_experiment_by_name(record["experiment"])
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(record["experiment"])
        already = server_run_id(client, experiment_id, record["local_id"])  # created before, but the reply was lost
        if already:
            return already
        run = client.create_run(experiment_id, start_time=record["start_time"], tags=record["tags"],
                                run_name=record["run_name"])
        return run.info.run_id
    if kind == "log_batch":
        metrics = history.missing(run_id, record["metrics"]) if history else record["metrics"]
        if metrics or record["params"] or record["tags"]:
            client.log_batch(run_id, metrics=[Metric(m["key"], m["value"], m["timestamp"], m["step"]) for m in metrics],
                             params=[Param(k, v) for k, v in record["params"].items()],
                             tags=[RunTag(k, v) for k, v in record["tags"].items()], synchronous=True)
    elif kind == "set_terminated":
        client.set_terminated(run_id, record["status"], end_time=record["end_time"])
    elif kind == "log_text":
        client.log_text(run_id, record["text"], record["artifact_file"])
    elif kind == "log_artifact":
        client.log_artifact(run_id, record["local_path"], record["artifact_path"])
    else:
        raise ValueError(f"unknown spool record kind {kind!r}")
    return None


# ---------------------------------------------------------------------------------------------
# Lines: a crash or a full disk mid-append leaves the last one cut short; every intact one still counts.

def read_lines(path: Path, required: tuple[str, ...]) -> tuple[list[dict], list[tuple[int, int]]]:
    """(every intact record of the JSON-lines file `path`, (line number, byte offset) of every damaged line): a line
    that is no JSON object holding the `required` keys is damaged (cut short by a crash, or overwritten)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], []
    records, damaged, offset = [], [], 0
    for number, line in enumerate(data.split(b"\n"), 1):
        if line.strip():
            try:
                record = json.loads(line)
            except ValueError:  # cut JSON, or bytes that are not UTF-8
                record = None
            if isinstance(record, dict) and all(key in record for key in required):
                records.append(record)
            else:
                damaged.append((number, offset))
        offset += len(line) + 1
    return records, damaged


def append_line(path: Path, line: str) -> None:
    """`line` appended to `path` and on disk before returning. A cut last line (a crash mid-append) is ended first,
    so that it stays one damaged line and the new record is whole on a line of its own."""
    with append_private(path) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        size = os.fstat(handle.fileno()).st_size
        cut = False
        if size:
            with open(path, "rb") as reading:
                reading.seek(size - 1)
                cut = reading.read(1) != b"\n"
        handle.write(("\n" if cut else "") + line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


class Spool:
    """`<name>.jsonl` (records in order) and `<name>.jsonl.acked` (ids the server took, and run ids it assigned)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.acked_path = self.path.with_name(self.path.name + ".acked")
        self.files = self.path.with_name(self.path.name + ".files")  # copies of file artifacts waiting to be sent

    def add(self, record: dict, uri: str) -> None:
        """Append one write, with the id that lets a re-send skip it once the server has taken it.

        The server's address is kept for the replay, with any password masked: it never goes to disk.
        """
        self.append({"id": uuid.uuid4().hex, "uri": redact_uri(uri), **record})

    def append(self, record: dict) -> None:
        append_line(self.path, json.dumps(record))

    def records(self) -> list[dict]:
        """The intact records, in order (`damaged` names the lines left out)."""
        return read_lines(self.path, ("id", "kind"))[0]

    def damaged(self) -> list[tuple[int, int]]:
        """(line number, byte offset) of each line that holds no whole record: it cannot be sent."""
        return read_lines(self.path, ("id", "kind"))[1]

    def acknowledged(self) -> tuple[set, dict]:
        """(ids of records the server took, local run id -> server run id). A damaged line is passed over: the record
        it acknowledged is sent again, which the server takes as once (MetricHistory, server_run_id)."""
        done, ids = set(), {}
        for entry in read_lines(self.acked_path, ("id",))[0]:
            done.add(entry["id"])
            if entry.get("run_id") and entry.get("local_id"):
                ids[entry["local_id"]] = entry["run_id"]
        return done, ids

    def acknowledge(self, record: dict, created_run_id: str | None, refusal: str | None = None) -> None:
        entry = {"id": record["id"]}
        if created_run_id:
            entry.update(local_id=record["local_id"], run_id=created_run_id)
        if refusal:
            entry["refused"] = refusal
        append_line(self.acked_path, json.dumps(entry))

    def replay(self, client, uri: str, warn=None) -> tuple[int, dict]:
        """Send every record not yet acknowledged, in order; raises at the first outage (what was sent stays
        acknowledged).

        A record the server refuses (see `refused`) is reported through `warn` and passed
        over, so that one bad write cannot hold back the rest. Returns (records the server
        took now, local -> server run ids). Deletes the spool once everything is acknowledged,
        unless a line of it is damaged: the replay command sets such a spool aside and says so.
        """
        done, ids = self.acknowledged()
        history, sent = MetricHistory(client), 0
        for record in self.records():
            if record["id"] in done:
                continue
            try:
                created = deliver(client, _map_ids(record, ids), history)
            except Exception as error:  # an outage stops the replay; a refusal skips one record
                if not refused(error, uri):
                    raise
                (warn or _warn)(f"MLflow refused a spooled {record['kind']} ({first_line(error)}); it is left out.")
                self.acknowledge(record, None, refusal=first_line(error))
                continue
            if created:
                ids[record["local_id"]] = created
            self.acknowledge(record, created)
            sent += 1
        if not self.damaged():
            self.remove()
        return sent, ids

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.acked_path.unlink(missing_ok=True)
        shutil.rmtree(self.files, ignore_errors=True)

    def set_aside(self) -> Path:
        """Once every intact record is acknowledged: the spool renamed to `<name>.jsonl.damaged`, which no replay
        picks again but a reader can look into, its acknowledgements and file copies deleted."""
        aside = self.path.with_name(self.path.name + DAMAGED_SUFFIX)
        os.replace(self.path, aside)
        self.acked_path.unlink(missing_ok=True)
        shutil.rmtree(self.files, ignore_errors=True)
        return aside

    def __len__(self) -> int:
        done, _ = self.acknowledged()
        return sum(record["id"] not in done for record in self.records())


def _warn(message: str) -> None:
    print(f"mpi_train: warning: {message}", file=sys.stderr, flush=True)


class SpoolingClient:
    """The MLflow writes of a running job: sent directly while the server answers, spooled (and re-sent later) while
    not.

    Thread-safe; calls are kept in order across threads by one lock. Reads and anything
    else fall through to the real client.
    """

    def __init__(self, client, uri: str, spool: Spool, experiment: str, online: bool = True, warn=None):
        self.client, self.uri, self.spool, self.experiment = client, uri, spool, experiment
        self.lock = threading.RLock()
        self.down = not online
        self.next_probe = 0.0 if online else time.monotonic() + PROBE_EVERY_S
        self.ids: dict[str, str] = {}  # local run id -> server run id, once a replay created the run
        self.warn = warn or _warn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    # -- the writes a job makes ---------------------------------------------------------------------

    def create_run(self, experiment_id: str | None, run_name: str, tags: dict) -> Any:
        """A run: on the server if it answers, else with a local id the replay maps to the server's."""
        with self.lock:
            if not self.down:
                return self.client.create_run(experiment_id, run_name=run_name, tags=tags)
            local_id = OFFLINE_PREFIX + uuid.uuid4().hex
            self._spool({"kind": "create_run", "local_id": local_id, "experiment": self.experiment,
                         "run_name": run_name, "tags": {**tags, OFFLINE_ID_TAG: local_id},
                         "start_time": int(time.time() * 1000)})
            return SimpleNamespace(info=SimpleNamespace(run_id=local_id))

    def log_batch(self, run_id: str, metrics=(), params=(), tags=(), synchronous: bool = True) -> None:
        self._write(batch_record(run_id, metrics, params, tags))

    def set_terminated(self, run_id: str, status: str = "FINISHED", end_time: int | None = None) -> None:
        self._write({"kind": "set_terminated", "run_id": run_id, "status": status,
                     "end_time": end_time or int(time.time() * 1000)})

    def set_tag(self, run_id: str, key: str, value: Any) -> None:
        self._write({"kind": "log_batch", "run_id": run_id, "metrics": [], "params": {}, "tags": {key: str(value)}})

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._write({"kind": "log_text", "run_id": run_id, "text": text, "artifact_file": artifact_file})

    def log_dict(self, run_id: str, dictionary: dict, artifact_file: str) -> None:
        self.log_text(run_id, json.dumps(dictionary, indent=2, default=str), artifact_file)

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        """A file artifact; while spooling, a copy of the file is kept beside the spool until it is sent."""
        self._write({"kind": "log_artifact", "run_id": run_id, "local_path": str(Path(local_path).resolve()),
                     "artifact_path": artifact_path})

    # -- outage handling -------------------------------------------------------------------------------

    def retry(self, now: bool = False) -> bool:
        """If the server was down and is due a check (or `now`): re-send the spool if it answers. True when all is
        sent."""
        with self.lock:
            if now:
                self.next_probe = 0.0
            return self._catch_up()

    def pending(self) -> int:
        """Writes still waiting in the spool."""
        with self.lock:
            return len(self.spool) if self.down else 0

    def _write(self, record: dict) -> None:
        with self.lock:
            if not self._catch_up():
                self._spool(record)
                return
            try:
                deliver(self.client, _map_ids(record, self.ids))
            except Exception as error:  # noqa: BLE001 - decided below: an outage, or a refusal
                if refused(error, self.uri):  # the server is up and said no: spooling would not help
                    self.warn(f"MLflow refused a write ({first_line(error)}); training continues.")
                    return
                self.down, self.next_probe = True, time.monotonic() + PROBE_EVERY_S
                self.warn(f"the MLflow server at {redact_uri(self.uri)} stopped answering; training "
                          f"continues and everything logged is kept in {self.spool.path} until it is back.")
                self._spool(record)

    def _spool(self, record: dict) -> None:
        record = _map_ids(record, self.ids)  # runs created by an earlier re-send are named by their server ids
        if (record["kind"] == "log_artifact"
                and not Path(record["local_path"]).is_relative_to(self.spool.files.resolve())):
            # the caller may delete its file
            keep = self.spool.files / uuid.uuid4().hex / Path(record["local_path"]).name
            keep.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            shutil.copyfile(record["local_path"], keep)
            keep.chmod(0o600)
            record = {**record, "local_path": str(keep.resolve())}
        self.spool.add(record, self.uri)

    def _catch_up(self) -> bool:
        """True if writes may go straight to the server: it is up and the spool has been re-sent."""
        if not self.down:
            return True
        if time.monotonic() < self.next_probe:
            return False
        self.next_probe = time.monotonic() + PROBE_EVERY_S
        if not server_answers(self.uri):
            return False
        try:
            sent, ids = self.spool.replay(self.client, self.uri, self.warn)
        except Exception:  # noqa: BLE001 - it went away again: what was sent is acknowledged, the rest waits
            return False
        self.ids.update(ids)
        self.down = False
        self.warn(f"the MLflow server at {redact_uri(self.uri)} is back; {sent} spooled write(s) sent.")
        return True
