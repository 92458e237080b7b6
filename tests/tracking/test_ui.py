"""The comparison in the MLflow UI itself, as a user sees it: a small experiment (three sync methods and a bench)
against a real server, its printed links, its runs, and the UI in headless Chromium."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import MPI_ENV, REPO, client_for
from ui_browser import browser_page, keep_screenshot, settle, why_no_browser

pytestmark = pytest.mark.e2e
METHODS = ("allreduce", "ddp", "bucketed")
BENCH = ("allreduce", "ddp", "bucketed", "flat+fp16")


@pytest.fixture(scope="module")
def experiment(mlflow_server, tmp_path_factory):
    """`python -m mpi_train experiment` on a small file: three methods at np 2, then the bench of four labels."""
    tmp = tmp_path_factory.mktemp("ui")
    path = tmp / "ui.toml"
    path.write_text(f"""
[experiment]
name = "tests-ui"
tracking_uri = "{mlflow_server}"
out = "{tmp / 'out'}"
[launch]
hostfile = ""
mpirun_args = ["--oversubscribe"]
timeout = 240
[train]
dataset = "synthetic"
synthetic_size = 256
batch_size = 32
max_steps = 6
log_every = 2
system_metrics_every = 0
[[sweep]]
sync = {list(METHODS)}
np = 2
[bench]
np = 2
steps = 3
warmup = 1
batch_size = 16
model = "mnist_cnn"
methods = {list(BENCH)}
""".replace("'", '"'))
    result = subprocess.run([sys.executable, "-m", "mpi_train", "experiment", str(path)],
                            capture_output=True, text=True, timeout=500,
                            cwd=REPO, env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO)}, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    client = client_for(mlflow_server)
    return {"out": result.stdout, "client": client, "server": mlflow_server,
            "id": client.get_experiment_by_name("tests-ui").experiment_id}


def test_the_printed_links_land_on_the_runs_page_and_its_charts(experiment):
    runs = f"{experiment['server']}/#/experiments/{experiment['id']}/runs"
    charts = f"{runs}?viewStateShareKey=by-method&compareRunsMode=CHART"
    assert f"MLflow runs: {runs}?viewStateShareKey=runs; charts comparing them by method: {charts}" in experiment["out"]
    assert "View experiment at" not in experiment["out"]  # MLflow's own link opens the GenAI overview


def test_the_bench_is_a_run_with_a_child_per_method_and_the_same_keys_in_each(experiment):
    client, experiment_id = experiment["client"], experiment["id"]
    (bench,) = client.search_runs([experiment_id], "tags.`mpi_train.role` = 'bench'")
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{bench.info.run_id}'")
    labels = {f"{c.data.params['sync']}+{c.data.params['compression']}".replace("+none", "") for c in children}
    assert labels == {"no-sync", "allreduce", "ddp", "bucketed", "flat+fp16"}
    for child in children:
        keys = set(child.data.metrics)
        assert {"sync_cost/step_s", "sync_cost/compute_s", "sync_cost/sync_s", "sync_cost/exposed_s"} <= keys
        assert all(key.startswith("sync_cost/") and not any(m in key for m in (*BENCH, "no-sync")) for key in keys)
        assert {"sync", "compression", "bucket_mb", "link", "num_hosts", "world_size"} <= set(child.data.params)
    bucketed = next(c for c in children if c.data.params["sync"] == "bucketed")
    assert bucketed.data.params["bucket_mb"] == "25" and bucketed.data.params["link"] == "unlimited"
    assert not bench.data.metrics  # the figures are on the methods' runs, not keyed by name on the bench's


def test_a_person_sees_the_runs_and_the_methods_compared(experiment):
    reason = why_no_browser()
    if reason:
        pytest.skip(reason)
    runs = f"{experiment['server']}/#/experiments/{experiment['id']}/runs"
    with browser_page() as page:
        page.goto(f"{runs}?viewStateShareKey=runs")
        settle(page, f"{METHODS[0]}-np2-seed42")
        shown = page.inner_text("body")
        assert "Training runs" in shown and all(f"{method}-np2-seed42" in shown for method in METHODS), shown[-2000:]
        assert "summary/step_s" in shown and "summary/sync_s" in shown  # the figures that compare jobs, as columns
        keep_screenshot(page, "ui-runs.png")

        page.goto(f"{runs}?viewStateShareKey=by-method&compareRunsMode=CHART")
        settle(page, "learning/loss")
        sections = re.findall(r"^([a-z_]+)\n\(\d+\)$", page.inner_text("body"), flags=re.MULTILINE)
        assert sections[0] == "learning" and {"time", "summary", "sync_cost"} <= set(sections), sections
        page.get_by_placeholder("Search metric charts").fill("sync_cost/")  # the bench's charts: a bar per method
        page.get_by_text("sync_cost/compute_s", exact=True).first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        chart = page.locator("div", has=page.get_by_text("sync_cost/compute_s", exact=True))
        cards = [chart.nth(i).inner_text() for i in range(chart.count())]
        legend = min((text for text in cards if "sync: " in text), key=len)  # the chart's own card, with its legend
        for label in ("no-sync", *BENCH):
            sync, _, compression = label.partition("+")
            assert f"sync: {sync}, compression: {compression or 'none'}" in legend, legend
        keep_screenshot(page, "ui-charts.png")
