"""The advisor: its lossy options with their measured accuracy cost, and one real run under mpirun that a training job
with --sync auto then follows."""

import json
import re

import pytest
from conftest import client_for, mpirun

from mpi_train import netmodel
from mpi_train.advice.search import Candidate, StepModel
from mpi_train.commands import advise
from mpi_train.commands.bench import NO_SYNC
from mpi_train.config import TrainConfig
from mpi_train.models import build_model
from mpi_train.sync import SYNC_METHODS
from mpi_train.sync.base import REPLICATED


def test_lossy_options_are_listed_apart_with_the_accuracy_cost_measured_where_it_was():
    model = build_model("vgg11")
    sizes = netmodel.tensor_sizes(model)
    step = StepModel(tuple(sizes), netmodel.Layout(4, 2), netmodel.Network(netmodel.LOOPBACK_LINK,
                                                                            netmodel.nominal_link("100mbit")),
                     netmodel.ASSUMED_BACKWARD, 1.0, 1.0)
    rows, refused = advise.lossy_options("vgg11", list(model.parameters()), step, "gloo")
    options = {row["label"]: row for row in rows}
    assert {"flat_fp16", "ddp_fp16", "bucketed+bf16", "ring+powersgd", "localsgd", "diloco"} <= set(options)
    assert not {"flat", "ddp", "bucketed", "ring"} & set(options)  # the lossless ones are the search's
    assert [name for name, _ in refused] == ["ddp_powersgd"]  # NCCL only
    assert options["bucketed+fp16"]["accuracy_points"] == 0.62 and options["ddp_fp16"]["accuracy_points"] == 0.62
    assert options["flat+powersgd"]["accuracy_points"] == -1.78
    assert options["localsgd"]["accuracy_points"] == -4.54 and options["diloco"]["accuracy_points"] == -14.57
    assert options["bucketed+bf16"]["accuracy_points"] is None and options["diloco+bf16"]["accuracy_points"] is None
    assert options["flat+powersgd"]["predicted_step_s"] < options["flat_fp16"]["predicted_step_s"]  # 0.24 MB
    lines = advise.lossy_table(rows)
    by_option = {line.split()[0]: line for line in lines[1:] if not line.startswith("  [")}
    sources = {int(number): text for number, text in (re.match(r"  \[(\d+)\] (.*)", line).groups()
                                                      for line in lines if line.startswith("  ["))}
    for option, points, measured in (("fp16", "+0.62", "bucketed+fp16, CIFAR-10"),
                                     ("powersgd", "-1.78", "bucketed+powersgd rank 2"),
                                     ("localsgd", "-4.54", "localsgd --period 8")):
        number = int(re.search(rf"{re.escape(points)} points \[(\d+)\]$", by_option[option]).group(1))
        assert sources[number].startswith(measured) and "docs/results.md#" in sources[number]  # numbered, below
    assert by_option["bf16"].endswith("not measured")
    # each averaging method's lossless or cast options again with their averages in the background: never slower,
    # listed with the accuracy cost measured for it, where it was
    overlapped = options["localsgd+fp16 --overlap"]
    assert overlapped["flags"][-1] == "--overlap" and overlapped["accuracy_points"] == -3.03
    fragmented = options["localsgd+fp16 --overlap --fragments 4"]  # a quarter of the model every 2 steps
    assert fragmented["flags"][-3:] == ["--overlap", "--fragments", "4"] and fragmented["accuracy_points"] == -1.33
    assert advise.configured(fragmented["label"]).fragments == 4 and advise.configured(fragmented["label"]).overlap
    assert options["diloco+fp16 --overlap"]["accuracy_points"] is None
    assert overlapped["predicted_step_s"] <= options["localsgd+fp16"]["predicted_step_s"]
    assert "localsgd+powersgd --overlap" not in options  # PowerSGD's rounds do not stream
    # priced and flagged as their accuracy was measured: a host's ranks averaged every step, PowerSGD at period 4
    assert fragmented["flags"][-5:-3] == ["--host-period", "1"] and "--host-period" not in options["localsgd"]["flags"]
    assert options["localsgd+powersgd"]["flags"][-2:] == ["--period", "4"]
    plain = SYNC_METHODS["localsgd"].from_config(TrainConfig(sync="localsgd", compression="powersgd"))
    assert options["localsgd+powersgd"]["predicted_step_s"] > 1.0 + netmodel.predict(
        plain, sizes, step.layout, step.network, ratio=plain.wire_ratio(list(model.parameters()))).sync_s


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
    replica = {held[name] for name in held if SYNC_METHODS[name].shards == REPLICATED}
    assert len(replica) == 1 and {"zero", "fsdp", "zero_torch"} <= set(held)
    assert all(held[name] < min(replica) for name in held if SYNC_METHODS[name].shards != REPLICATED)
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


def test_the_full_bench_check_finds_the_regret_and_ranks_predicted_against_measured():
    """Three configurations timed on two ranks (the slower rank's step counts): the recommendation is 10% slower
    than the fastest, and the measured order turns the predicted one round for one pair."""
    tensors = [4 * 2**20, 4 * 2**20]
    model = StepModel(tuple(tensors), netmodel.Layout(2, 1),
                      netmodel.Network(netmodel.Link(50e-6, 1 / 2e9), netmodel.Link(100e-6, 1 / 12.5e6)),
                      netmodel.ASSUMED_BACKWARD, 1.0, 1.01)
    grid = [Candidate("allreduce"), Candidate("bucketed", 4.0), Candidate("gather_scatter")]
    steps = {NO_SYNC: 1.0, "allreduce": 1.5, "bucketed@4MB": 1.65, "gather_scatter": 2.0}
    per_rank = [{name: {"step": [step * (1 + rank / 100)] * 3} for name, step in steps.items()} for rank in range(2)]
    check = advise.full_bench_check(grid, per_rank, 12.0, model, "bucketed@4MB", 3)
    assert check["fastest"] == "allreduce" and check["regret"] == pytest.approx(0.1)
    assert [row["label"] for row in check["configurations"]] == ["allreduce", "bucketed@4MB", "gather_scatter"]
    predicted = {row["label"]: row["predicted_step_s"] for row in check["configurations"]}
    assert predicted["bucketed@4MB"] < predicted["allreduce"] < predicted["gather_scatter"]  # overlapped: hidden
    assert check["kendall_tau"] == pytest.approx(1 / 3) and check["no_sync_step_s"] == pytest.approx(1.01)
    text = "\n".join(advise.describe_full_bench(check))
    assert "regret +10.0%" in text and "0.33 over every configuration" in text


def test_a_measured_difference_within_the_bench_noise_does_not_overturn_the_model():
    def row(label, predicted, measured):
        candidate = Candidate("bucketed", float(label[9:-2])) if "@" in label else Candidate(label)
        return {**candidate.as_dict(), "predicted_step_s": predicted, "predicted_exposed_s": 0.1,
                "predicted_comm_s": 0.3, "measured_step_s": measured, "binds": "the between-host link"}

    model = StepModel((4e6,), netmodel.Layout(4, 2), netmodel.Network(netmodel.Link(0, 1e-9), netmodel.Link(0, 1e-8)),
                      netmodel.ASSUMED_BACKWARD, 1.0, 1.0)
    assert advise.bench_noise([2.0, 2.02]) == advise.NOISE_FLOOR and advise.bench_noise([2.0, 2.5, 2.0]) == 0.25
    close = {"bucketed@8MB": row("bucketed@8MB", 1.1, 1.30), "ddp": row("ddp", 1.2, 1.28)}
    kept = advise.recommendation(close, "bucketed@8MB", model, noise=0.03)
    assert kept["label"] == "bucketed@8MB" and "within the bench's noise (3%" in kept["why"]
    far = {"bucketed@8MB": row("bucketed@8MB", 1.1, 1.30), "ddp": row("ddp", 1.2, 1.20)}
    overturned = advise.recommendation(far, "bucketed@8MB", model, noise=0.03)
    assert overturned["label"] == "ddp" and "slower by more than the bench's noise (3%)" in overturned["why"]
    assert advise.recommendation(far, "bucketed@8MB", model, noise=0.1)["label"] == "bucketed@8MB"
