"""Rank 0's MLflow records of a bench and of an advice: a parent run with the setting as params and the JSON and
table as artifacts, and a child run per method or candidate shown, so MLflow's chart view compares them."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .. import netmodel, tracking
from ..sync import split_label
from ..sync.bucketed import DEFAULT_BUCKET_MB
from ..sync.messages import BUCKETS
from ..tracking import names as metric_names
from ..tracking.links import share_views
from .contenders import configured


def method_params(row: dict, result: dict) -> dict:
    """A method's child run params: what it is and where it ran, the same keys on every child."""
    name, compression = split_label(row["method"])
    layout = result.get("layout") or {}
    method = configured(row["method"], result.get("bucket_mb", DEFAULT_BUCKET_MB))
    bucket = method.traits.bucket_caps[1] / 2**20 if method.traits.messages == BUCKETS else None
    return {"sync": name, "compression": compression, "bucket_mb": f"{bucket:g}" if bucket else "-",
            "collective": row.get("collective") or "-", "link": result.get("network_link") or "unlimited",
            "num_hosts": layout.get("hosts", 1), "ranks_per_host": layout.get("ranks_per_host", result["world_size"]),
            "world_size": result["world_size"], "model": result["model"], "batch_size": result["batch_size"]}


def method_metrics(row: dict) -> dict:
    """A method's figures under the same `bench/` keys on every child run (tracking/names.py), so one chart per
    figure holds every method."""
    sent = max(row["sent_bytes"]) / 1e6 if row.get("sent_bytes") else None
    figures = {"step_s": row["step_s"], "compute_s": row["compute_s"], "sync_s": row["sync_s"],
               "exposed_s": row["exposed_s"], "predicted_s": row.get("predicted_s"),
               "prediction_error": row.get("prediction_error"), "sent_mb": sent, "codec_s": row.get("codec_s"),
               "codec_backward_s": row.get("codec_backward_s"), "after_backward_s": row.get("after_backward_s"),
               "efficiency": row.get("efficiency")}
    return {metric_names.bench_key(key): float(value) for key, value in figures.items()
            if isinstance(value, (int, float)) and math.isfinite(value)}


def log_bench(connection: tracking.Connection, run_name: str, result: dict, text: str) -> str:
    """Rank 0: the bench as a parent run (its setting as params, the JSON and the table as artifacts) with one child
    run per method label, so MLflow's chart view compares the methods side by side."""
    from mlflow.entities import Param

    client, experiment = connection.client, connection.experiment_id
    with parent_run(connection, run_name, {"mpi_train.role": "bench"}) as (run_id, opened):
        params = {key: result[key] for key in ("world_size", "backend", "model", "batch_size", "steps", "warmup",
                                               "gradient_bytes", "precision")}
        layout = result.get("layout") or {}
        params.update(link=result.get("network_link") or "unlimited", num_hosts=layout.get("hosts", 1),
                      ranks_per_host=layout.get("ranks_per_host", result["world_size"]))
        client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()], synchronous=True)
        client.log_dict(run_id, result, "bench.json")
        client.log_text(run_id, text + "\n", "bench.txt")
        setting = f"np{result['world_size']}" + (f"-h{layout['hosts']}-{result['network_link']}"
                                                 if result.get("network_link") else "")
        stamp = int(time.time() * 1000)
        for row in result["methods"]:
            log_child(client, experiment, run_id, f"{row['method']}-{setting}", "bench_method", method_metrics(row),
                      method_params(row, result), stamp, opened)
    return run_id


@contextlib.contextmanager
def parent_run(connection: tracking.Connection, run_name: str, tags: dict
               ) -> Iterator[tuple[str, Callable[[str], None]]]:
    """A parent run, and the function each child run's id is handed to as it is made. All end KILLED if interrupted,
    FAILED if logging them fails, else the parent FINISHED (each child ends itself) and the experiment's shared chart
    views set. A run guard (tracking/guard.py) ends them KILLED if this process is killed first: mpirun follows the
    SIGTERM of a Ctrl-C with SIGKILL in well under a second."""
    from ..tracking.guard import RunGuard  # here, not at the top: the guard's own process imports this package first

    client, experiment = connection.client, connection.experiment_id
    run_id = client.create_run(experiment, run_name=run_name, tags=tags).info.run_id
    guard = RunGuard(connection.uri, run_id, []) if connection.online else None
    children: list[str] = []

    def opened(child_id: str) -> None:
        children.append(child_id)
        if guard is not None:
            guard.add_child(child_id)

    try:
        try:
            yield run_id, opened
        except BaseException as error:
            status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
            for failed in [*children, run_id]:
                with contextlib.suppress(Exception):  # the server's own failure: the guard has gone by then
                    client.set_terminated(failed, status)
            raise
        client.set_terminated(run_id, "FINISHED")
        share_views(client, experiment)
    finally:
        if guard is not None:
            guard.done()


def log_child(client, experiment: str, parent_id: str, name: str, role: str, metrics: dict, params: dict,
              stamp: int, opened: Callable[[str], None]) -> str:
    """One child run of `parent_id` (a bench's method, an advice's candidate) with its metrics and params, ended
    FINISHED (FAILED if logging them fails); its id, handed to `opened` as soon as it exists."""
    from mlflow.entities import Metric, Param

    child = client.create_run(experiment, run_name=name, tags={"mlflow.parentRunId": parent_id,
                                                               "mpi_train.role": role}).info.run_id
    opened(child)
    try:
        client.log_batch(child, metrics=[Metric(k, float(v), stamp, 0) for k, v in metrics.items()],
                         params=[Param(k, str(v)) for k, v in params.items()], synchronous=True)
    except BaseException:
        client.set_terminated(child, "FAILED")
        raise
    client.set_terminated(child, "FINISHED")
    return child


def link_text(link: netmodel.Link) -> str:
    return f"{link.alpha * 1e6:.0f} us + m / {link.bandwidth / 1e6:,.1f} MB/s"


def log_advice(connection: tracking.Connection, run_name: str, result: dict, text: str, files: Sequence[Path]) -> str:
    """Rank 0: the advice as a parent run (hosts and links as params; the JSON, table and plot as artifacts) with a
    child run per candidate shown, its predicted and measured step as metrics, as the bench logs its methods."""
    from mlflow.entities import Metric, Param

    client, experiment = connection.client, connection.experiment_id
    recommended = " ".join(result["recommended"]["flags"])
    tags = {"mpi_train.role": "advice", "mpi_train.recommended": recommended}
    with parent_run(connection, run_name, tags) as (run_id, opened):
        network = netmodel.Network.from_dict(result["calibration"]["network"])
        layout = result["layout"]
        links = result["calibration"]
        params = {"model": result["model"], "batch_size": result["batch_size"], "world_size": result["world_size"],
                  "backend": result["backend"], "precision": result["precision"],
                  "hosts": ",".join(dict.fromkeys(result["hosts"])),
                  "num_hosts": layout["hosts"], "ranks_per_host": layout["ranks_per_host"],
                  "link": result.get("link") or "unlimited", "recommended": recommended,
                  "link_between_hosts": link_text(network.inter), "link_within_host": link_text(network.intra),
                  "calibration": f"reused from {links['reused_from']}" if links.get("reused_from") else "measured"}
        stamp = int(time.time() * 1000)
        figures = {"kendall_tau": result.get("kendall_tau"), "calibration_age_s": result["calibration_age_s"],
                   "recommended_predicted_step_s": result["recommended"]["predicted_step_s"],
                   "recommended_measured_step_s": result["recommended"]["measured_step_s"]}
        client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()],
                         metrics=[Metric(metric_names.advice_key(k), float(v), stamp, 0) for k, v in figures.items()
                                  if v is not None], synchronous=True)
        client.log_dict(run_id, result, "advice.json")
        client.log_text(run_id, text + "\n", "advice.txt")
        for path in files:
            client.log_artifact(run_id, str(path))
        setting = f"np{result['world_size']}" + (f"-h{layout['hosts']}-{result['link']}" if result.get("link") else "")
        for row in (row for row in result["candidates"] if row["shown"]):
            values = {key: row[key] for key in ("predicted_step_s", "predicted_exposed_s", "measured_step_s",
                                                "measured_exposed_s") if row.get(key) is not None}
            log_child(
                client, experiment, run_id, f"{row['label']}-{setting}", "advice_candidate",
                {metric_names.advice_key(k): v for k, v in values.items()},
                {"sync": row["sync"], "compression": "none", "bucket_mb": row["bucket_mb"] or "-",
                 "flags": " ".join(row["flags"]), "world_size": result["world_size"], "model": result["model"],
                 "batch_size": result["batch_size"]}, stamp, opened)
    return run_id
