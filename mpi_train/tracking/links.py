"""Where to see runs in the MLflow UI: the runs page of their experiment, and its charts by method.

MLflow's own client prints "View experiment at .../#/experiments/<id>", which opens the GenAI
overview (traces, latency, token usage); a training run lives on `#/experiments/<id>/runs`.
The links open that page in views MLflow shares through experiment tags
(`mlflow.sharedViewState.<key>`, its Share button's mechanism), which share_views writes: the runs
table with the figures that compare jobs as columns, and the chart view grouped by method. MLflow
charts only the runs
its table shows, and nests child runs (a bench's methods, a job's ranks) under their parent,
folded; grouped by the params `sync` and `compression`, the groups take in child runs too, so
each chart has one bar or line per method: the bench's methods and the training jobs (a mean
over seeds) side by side.
A database store has no UI of its own: the link says which server command shows it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from . import names
from .store import DEFAULT_STORE_DIR, SERVER_SCHEMES

SERVER_URL = "http://127.0.0.1:5000"  # where `python -m mpi_train server` listens by default
RUNS_VIEW, METHOD_VIEW = "runs", "by-method"
COLUMNS = (*(f"params.`{key}`" for key in ("sync", "compression", "world_size", "num_hosts")),
           *(f"metrics.`{names.summary_key(key)}`"
             for key in ("step_time_s", "sync_time_s", "samples_per_s", "test_accuracy", "final_loss")))
VIEWS = {  # the UI state each shared view opens (MLflow's own keys)
    RUNS_VIEW: {"selectedColumns": list(COLUMNS)},  # the runs table, with the figures that compare jobs as columns
    # the chart view grouped by method, every run charted, empty charts left out
    METHOD_VIEW: {"groupBy": {"aggregateFunction": "average",
                              "groupByKeys": [{"mode": "param", "groupByData": "sync"},
                                              {"mode": "param", "groupByData": "compression"}]},
                  "useGroupedValuesInCharts": True, "runsHiddenMode": "SHOW_ALL", "hideEmptyCharts": True},
}


def share_views(client, experiment_id: str) -> None:
    """Write the shared views into the experiment (idempotent); a store that refuses says so, and nothing stops."""
    try:
        for key, state in VIEWS.items():
            client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{key}", json.dumps(state))
    except Exception as error:  # noqa: BLE001 - the links are a convenience: a refusal must not stop a job
        print(f"mpi_train: warning: could not save the runs and chart views in the experiment ({error})",
              file=sys.stderr)


def ui_base(uri: str) -> str | None:
    """The UI's address for a tracking server URI, without any user name or password; None for a database store."""
    parts = urlsplit(uri)
    if parts.scheme.lower() not in SERVER_SCHEMES:
        return None
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def runs_page(uri: str, experiment_id: str, charts: bool = False) -> str:
    """The runs page of an experiment, as a table or as charts by method (views share_views must have written), on
    its server or the server command's."""
    base = ui_base(uri) or SERVER_URL
    view = f"?viewStateShareKey={METHOD_VIEW}&compareRunsMode=CHART" if charts else f"?viewStateShareKey={RUNS_VIEW}"
    return f"{base}/#/experiments/{experiment_id}/runs{view}"


def run_page(uri: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_base(uri) or SERVER_URL}/#/experiments/{experiment_id}/runs/{run_id}"


def server_hint(uri: str) -> str:
    """How to open a database store's runs in a browser (nothing for a server, which is its own UI)."""
    if ui_base(uri) is not None:
        return ""
    path = uri.split(":///", 1)[-1]
    root = Path(path).parent
    flag = "" if root == Path(DEFAULT_STORE_DIR) else f" --root {root}"
    return f" (start the UI with `python -m mpi_train server{flag}` from this folder)"


def where(uri: str, experiment_id: str, run_id: str | None = None, charts: bool = False) -> str:
    """One line saying where the runs are: the runs page, and the run's own page or the chart view."""
    line = f"runs: {runs_page(uri, experiment_id)}"
    if run_id:
        line += f" (this run: {run_page(uri, experiment_id, run_id)})"
    if charts:
        line += f"; charts comparing them by method: {runs_page(uri, experiment_id, charts=True)}"
    return line + server_hint(uri)
