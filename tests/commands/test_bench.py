"""The sync-cost benchmark: closed-form traffic, and a real run under mpirun with every registered method."""

import json
import re
import sys
from pathlib import Path

import pytest
from conftest import client_for, mpirun

from mpi_train.benchmark.contenders import NO_SYNC
from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.lab import mpirun as launch
from mpi_train.models import build_model
from mpi_train.netmodel import load_calibration, tensor_units
from mpi_train.sync import backend_error, every_label, parse_labels, split_label
from mpi_train.sync.compression.powersgd import PowerSGD

MB = 1e6


@pytest.mark.e2e
def test_bench_at_np2_reports_every_method_with_closed_form_bytes(tmp_path):
    out = tmp_path / "bench.json"
    result = mpirun(2, ["--model", "mnist_cnn", "--batch-size", "8", "--steps", "4", "--warmup", "1", "--link-iters",
                        "2", "--no-tracking", "--json", str(out)], module="mpi_train bench", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    labels = every_label()
    runnable = [name for name in labels if not backend_error(split_label(name)[0], "gloo")]
    assert "bucketed+powersgd" in runnable and "hierarchical+fp16" in runnable and "ddp_fp16" in runnable
    assert "gather_scatter+fp16" not in labels and "ddp+powersgd" not in labels  # pairs that cannot work are not tried
    table = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.split()[:1]}
    for name in (NO_SYNC, *runnable):
        assert name in table, result.stdout
    assert "unavailable: ddp_powersgd: --sync ddp_powersgd cannot run on the gloo backend" in result.stdout
    data = json.loads(out.read_text())
    params = list(build_model("mnist_cnn").parameters())
    size = sum(p.numel() for p in params) * 4
    assert data["gradient_bytes"] == size and data["world_size"] == 2
    assert data["precision"] == "32-true" and "backend gloo, 32-true, mnist_cnn" in result.stdout  # auto on CPUs
    assert [row["method"] for row in data["methods"]] == [NO_SYNC, *runnable]
    bandwidth = data["link"]["bandwidth_bytes_per_s"]
    assert bandwidth > 0
    calibration = data["calibration"]
    assert (calibration["points"]["intra"]["sizes"][0] == 1024
            and calibration["points"]["intra"]["sizes"][-1] == data["gradient_bytes"])
    assert calibration["network"]["intra"]["beta"] > 0 and calibration["allreduce"]["fit_error"] >= 0
    # the sharded collectives fitted beside the allreduce, over the same sizes (the buffer split evenly by 2 ranks),
    # read back as the network's measured costs: what prices zero's and fsdp's collectives
    # (and, on Gloo, zero's own ring reduce-scatter, which zero runs there), and the allreduce the ring family's
    for name in ("reduce_scatter", "all_gather", "ring_reduce_scatter"):
        fit = calibration[name]
        assert fit["beta"] > 0 and fit["alpha"] >= 0 and fit["sizes"][-1] == data["gradient_bytes"] // 8 * 8, name
    costs = load_calibration(out).collectives
    assert [cost.name for cost in costs] == ["allreduce", "reduce_scatter", "all_gather", "ring_reduce_scatter"]
    assert all(cost.beta_factor > 0 for cost in costs)
    assert "reduce_scatter of m bytes on all 2 ranks:" in result.stdout
    # when the no-sync replica's gradients were ready, for the overlapped predictions
    backward = calibration["backward"]
    assert (0.3 < backward["share"] < 1 and len(backward["ready"]) == len(params)
            and backward["ready"][-1] < backward["ready"][0])
    assert data["layout"] == {"hosts": 1, "ranks_per_host": 2, "host_of_rank": data["layout"]["host_of_rank"]}
    for row in data["methods"][1:]:
        model = row["collective"]
        if model is None:  # a method added without a cost model: shown as n/a, checked above
            continue
        compression = split_label(row["method"])[1]
        if compression == "powersgd":
            size = PowerSGD(rank=2).wire_bytes(params)
            assert size < 0.2 * data["gradient_bytes"]
        else:
            narrow = compression in ("fp16", "bf16") or row["method"] in ("flat_fp16", "ddp_fp16")
            size = data["gradient_bytes"] // 2 if narrow else data["gradient_bytes"]
        assert row["wire_bytes"] == pytest.approx(size), row["method"]
        # each rank's bytes at N = 2, per S: an allreduce's 2(N-1)/N (on one host, two_level is plain allreduce;
        # a reduce-scatter and an all-gather are one), FSDP's third collective and ZeRO-1's broadcasts 3(N-1)/N;
        # zero's all-gather carries the float32 parameters whatever its reduce-scatter's compression
        per_rank = {"ring_allreduce": size, "two_level": size, "reduce_scatter": (size + data["gradient_bytes"]) / 2,
                    "layerwise_gather": 1.5 * size, "ring_then_broadcast": 1.5 * size}
        if model in per_rank:
            expected = [per_rank[model]] * 2
            assert row["floor_s"] == pytest.approx(per_rank[model] / bandwidth)
        else:
            expected = [(2 - 1) * size, size]
            assert row["floor_s"] == pytest.approx(2 * (2 - 1) * size / bandwidth)
        assert row["sent_bytes"] == pytest.approx(expected) and row["received_bytes"] == pytest.approx(expected)
        assert row["sync_s"] > 0 and row["compute_s"] > 0
        if row["method"].split("+")[0] in ("ddp", "ddp_fp16", "bucketed", "zero", "fsdp", "zero_torch"):
            assert row["efficiency"] is None and row["overlapped"]  # inside backward: no time to hold the floor against
        else:
            assert 0 < row["efficiency"] <= 1
        assert row["predicted_s"] > 0 and row["measured_s"] is not None
        if row["method"] == "fsdp":  # a message per unit: the MNIST CNN's 4 layers
            assert row["messages"] == len(set(tensor_units(build_model("mnist_cnn")))) == 4
        assert len(data["per_rank_times"][0][row["method"]]["sync"]) == 4
        # the compressor's own CPU time: timed for every compressed method, absent for the rest
        compressed = compression != "none" or row["method"] == "flat_fp16"
        assert ((row["codec_s"] is not None and row["codec_s"] > 0) if compressed
                else row["codec_s"] is None), row["method"]
        # the prediction charges the wire (predicted_comm_s, or what outlasts backward) and the codec measured here,
        # an overlapped method's placed between its sums, interval by interval, which can hide part of the wire
        placed = row["codec_placed"]
        assert (not placed or row["overlapped"] and compressed) and placed >= (row["method"] == "bucketed+powersgd")
        wire = row["predicted_s"] - (sum(row["codec_intervals_s"]) if placed else row["codec_s"] or 0.0)
        assert (0 <= wire <= row["predicted_comm_s"] + 1e-12
                and (wire == pytest.approx(row["predicted_comm_s"]) or row["overlapped"]))
    # a language model as training names it: the bench times its tensors (the tied embedding once)
    gpt = ["--model", "gpt", "--gpt-layers", "1", "--gpt-width", "32", "--gpt-heads", "2", "--context", "16"]
    result = mpirun(2, [*gpt, "--batch-size", "4", "--steps", "2", "--warmup", "1", "--link-iters", "1", "--methods",
                        "allreduce,bucketed+powersgd", "--precision", "bf16-mixed", "--no-tracking", "--json",
                        str(out)], module="mpi_train bench", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["precision"] == "bf16-mixed" and ", bf16-mixed, methods no-sync," in result.stdout
    params = [p for p in TrainConfig(**data["model_flags"]).make_model().parameters()]
    assert data["model_described"] == "gpt (1 layers, 2 heads, width 32, context 16)" and data["model"] == "gpt"
    assert data["gradient_bytes"] == 4 * sum(p.numel() for p in params)
    assert len(data["calibration"]["backward"]["ready"]) == len(params)
    rows = {row["method"]: row for row in data["methods"]}
    assert rows["bucketed+powersgd"]["wire_bytes"] == pytest.approx(PowerSGD(rank=2).wire_bytes(params))
    assert rows["allreduce"]["wire_bytes"] == data["gradient_bytes"] and rows["allreduce"]["predicted_s"] > 0


def test_methods_named_for_the_bench_are_checked_before_it_starts():
    assert parse_labels("ddp, bucketed+powersgd") == ["ddp", "bucketed+powersgd"]
    with pytest.raises(UserError, match="gather_scatter cannot carry --compression powersgd"):
        parse_labels("gather_scatter+powersgd")
    with pytest.raises(UserError, match="'bucketted' is not a sync method"):
        parse_labels("bucketted")



@pytest.mark.parametrize("flags, said", [
    ({"threads": 0}, "--threads must be positive, got 0"),
    ({"timeout": float("nan")}, "--timeout nan is out of range"),
])
def test_the_flags_the_bench_and_the_advisor_share_with_a_job_are_checked_as_a_jobs_are(flags, said):
    """--threads 0 once reached torch.set_num_threads, whose RuntimeError ended every rank in a traceback."""
    from argparse import Namespace

    from mpi_train.benchmark.flags import check_job_arguments

    args = {"link": None, "threads": None, "timeout": 300.0, "batch_size": 64}
    check_job_arguments(Namespace(**args), 4)
    with pytest.raises(UserError, match=said):
        check_job_arguments(Namespace(**{**args, **flags}), 4)


@pytest.mark.e2e
def test_the_tracking_overhead_benchmark_runs_both_jobs_and_reports_the_share(mlflow_server, tmp_path):
    result = launch.run([sys.executable, "-m", "mpi_train", "bench-tracking", "--np", "2", "--steps", "4", "--repeats",
                         "1", "--tracking-uri", mlflow_server], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    off_ms, on_ms = map(float, re.search(r"tracking off ([\d.]+) ms, on ([\d.]+) ms", result.stdout).groups())
    share = float(re.search(r"spent in the tracker: ([\d.]+)% of step time", result.stdout).group(1))
    assert off_ms > 0 and on_ms > 0
    client = client_for(mlflow_server)
    (tracked,) = client.search_runs([client.get_experiment_by_name("bench_tracking").experiment_id],
                                    "attributes.run_name LIKE 'on-%'")
    metrics = tracked.data.metrics
    tracking_share = metrics["summary/tracking_share"]
    assert tracking_share == pytest.approx(share / 100, abs=1e-5)  # the printed share is the job's own
    summary = json.loads(Path(client.download_artifacts(tracked.info.run_id, "summary.json",
                                                        str(tmp_path))).read_text())  # not a folder of its own
    steps_total = summary["mean_times"]["step_time_s"] * summary["total_steps"]
    assert tracking_share == pytest.approx(metrics["summary/tracking_loop_s"] / steps_total)
