"""A job's writes to a database store (SQLite, or a database MLflow reaches directly), which may refuse them mid-job.

A store's disk fills, or its file is made read-only or taken away, while a job trains: unlike a tracking server's
outage (spool.py), there is nothing to wait out and nowhere else to keep the writes. A write the store refuses is
dropped, counted and said once, never raised: training goes on, and the job's end says what its runs lack (its exit
status 2, as for any output it could not write). MLflow's own log lines for each refusal (an ERROR and two
tracebacks from SQLAlchemy) are left out (store.mlflow_client): the job's warning says it once.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from ..config import redact_uri
from .spool import _warn  # the tracking's one way to warn, as the spooling client does

# the client's calls that write; anything else (reads, the experiment's lookup) passes straight through
WRITES = frozenset({"log_batch", "log_metric", "log_param", "set_tag", "set_terminated", "log_text", "log_dict",
                    "log_artifact"})
# what a database driver said, after SQLAlchemy's own words: `(sqlite3.OperationalError) database or disk is full`
DRIVER_SAID = re.compile(r"\((?:sqlite3|psycopg2?|pymysql|MySQLdb|pyodbc)[\w.]*\)\s*([^\n\[]+)")
# MLflow's refusal of a write to a run someone deleted (or whose experiment they deleted) while the job ran
DELETED_RUN = re.compile(r"The run (\w+) must be in the 'active' state\. Current state is deleted")


def store_said(error: BaseException) -> str:
    """The store's own reason, without the SQL and SQLAlchemy's notes: `database or disk is full`."""
    found = DRIVER_SAID.search(str(error))
    if found:
        return found.group(1).strip()
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    lines = [line for line in str(error).splitlines() if line.strip() and not line.startswith("(raised as a result")]
    return (lines[0][:300] if lines else type(error).__name__).strip()


class StoreWrites:
    """An MLflow client whose writes never raise: a refused one is dropped, counted, and said once."""

    def __init__(self, client, uri: str, warn=_warn):
        self.client, self.uri, self.warn = client, uri, warn
        self.lock = threading.Lock()
        self.dropped = 0
        self.reason: str | None = None  # the store's reason for the first write it refused
        self.deleted: str | None = None  # the id of the run deleted under the job, if that is why

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)
        if name not in WRITES:
            return attribute

        def write(*args, **kwargs):
            try:
                return attribute(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - tracking must never stop training; said below
                self._refused(error)
                return None
        return write

    def _refused(self, error: BaseException) -> None:
        with self.lock:
            self.dropped += 1
            if self.reason is not None:
                return
            self.reason = store_said(error)
            deleted = DELETED_RUN.search(str(error))
            self.deleted = deleted.group(1) if deleted else None
        if self.deleted:
            self.warn(f"the job's run {self.deleted} was deleted from the MLflow store at {redact_uri(self.uri)} (or "
                      f"its experiment was) while the job ran: training continues, and what it would have recorded "
                      f"is left out.")
            return
        self.warn(f"the MLflow store at {redact_uri(self.uri)} refused a write ({self.reason}); training continues, "
                  f"and what the store does not take is left out of its runs.")

    def unrecorded(self) -> str | None:
        """What the job's runs lack and what mends it next time, in a sentence; None when the store took every
        write."""
        if not self.dropped:
            return None
        if self.deleted:
            return (f"its run {self.deleted} was deleted from the MLflow store at {redact_uri(self.uri)} (or its "
                    f"experiment was) while the job ran, so {self.dropped} of its writes were refused and the run "
                    f"lacks them. `mlflow runs restore --run-id {self.deleted}` (or `mlflow experiments restore`), "
                    f"with MLFLOW_TRACKING_URI={redact_uri(self.uri)}, brings back what it took")
        return (f"the MLflow store at {redact_uri(self.uri)} refused {self.dropped} of its writes ({self.reason}), so "
                f"its runs lack those figures and may still show RUNNING: free space on the store's disk (or make its "
                f"file writable), or point --tracking-uri at another store for the next run")
