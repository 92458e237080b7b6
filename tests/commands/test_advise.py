"""The advisor: one real run under mpirun whose recommendation a training job with --sync auto then follows."""

import json
import re

import pytest
from conftest import client_for, mpirun

from mpi_train.sync import SYNC_METHODS
from mpi_train.sync.base import REPLICATED


@pytest.mark.e2e
def test_advise_then_a_job_with_sync_auto_runs_what_it_recommends(tmp_path, quick_args, mlflow_server):
    done = mpirun(2, ["--model", "mnist_cnn", "--batch-size", "64", "--measure", "2", "--steps", "1",
                      "--warmup", "0", "--full-bench", "1", "--json", str(tmp_path / "advice.json"), "--tracking-uri",
                      mlflow_server, "--experiment", "advice"], module="mpi_train advise", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "advice.json").read_text())
    recommended = data["recommended"]
    assert f"recommended: {' '.join(recommended['flags'])}" in done.stdout and "why: " in done.stdout
    assert recommended["measured_step_s"] > 0 and recommended["predicted_step_s"] > 0
    assert data["calibration"]["network"]["intra"]["beta"] > 0 and data["calibration"]["backward"]["ready"]
    # timed in the job's precision, auto's pick on CPUs, which a job under --sync auto is held against
    assert (data["precision"], data["precision_flag"]) == ("32-true", "auto") and " ms in 32-true, " in done.stdout
    measured = [row for row in data["candidates"] if row["measured_step_s"] is not None]
    assert "ddp" in data["measured"] and len(measured) == len(data["measured"]) >= 2
    assert data["search"]["bucket_sizes_mb"] and data["lossy"]
    # memory per rank, predicted for every candidate (no limit was given): a whole replica for each method that
    # shards nothing, less for those that do
    assert data["memory_limit_bytes"] is None and data["over_memory_limit"] == [] and "mem_MiB" in done.stdout
    held = {row["sync"]: row["predicted_memory_bytes"] for row in data["candidates"]}
    replica = {held[name] for name in held if SYNC_METHODS[name].traits.shards == REPLICATED}
    assert len(replica) == 1 and {"zero", "fsdp", "zero_torch"} <= set(held)
    assert all(held[name] < min(replica) for name in held if SYNC_METHODS[name].traits.shards != REPLICATED)
    check = data["full_bench"]  # (its figures are checked in the test above; here, that the run holds them)
    labels = {row["label"] for row in check["configurations"]}
    assert set(data["measured"]) <= labels and {"ddp", "gather_scatter", "bucketed@25MB", "bucketed@1MB"} <= labels
    assert check["recommended"] == recommended["label"] and check["regret"] >= 0 and "regret" in done.stdout
    kept = list((tmp_path / "mlruns" / "advice").glob("mnist_cnn-b64-np2-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["recommended"] == recommended

    client = client_for(mlflow_server)
    experiment = client.get_experiment_by_name("advice").experiment_id
    (parent,) = client.search_runs([experiment], "tags.`mpi_train.role` = 'advice'")
    assert parent.data.params["recommended"] == " ".join(recommended["flags"])
    assert {"link_between_hosts", "link_within_host", "hosts", "calibration"} <= set(parent.data.params)
    assert parent.data.params["precision"] == "32-true"
    assert {item.path for item in client.list_artifacts(parent.info.run_id)} >= {"advice.json", "advice.txt",
                                                                                  kept[0].with_suffix(".png").name}
    children = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert all("advice/predicted_step_s" in child.data.metrics for child in children)
    assert sum("advice/measured_step_s" in child.data.metrics for child in children) == len(measured)

    summary = tmp_path / "summary.json"
    job = mpirun(2, [*quick_args, "--max-steps", "2", "--sync", "auto", "--summary-json", str(summary)], cwd=tmp_path)
    assert job.returncode == 0, job.stdout + job.stderr
    config = json.loads(summary.read_text())["config"]
    assert config["sync"] == recommended["sync"] and config["advice"] == str(kept[0].relative_to(tmp_path))
    if recommended["bucket_mb"] is not None:
        assert config["bucket_mb"] == recommended["bucket_mb"]
    assert re.search(rf"--sync auto runs {re.escape(' '.join(recommended['flags']))}, as the advice "
                     rf"{re.escape(config['advice'])} \(\d+ s old\) recommends", job.stdout)
    assert f"sync {recommended['sync']}, mnist_cnn on synthetic" in job.stdout

