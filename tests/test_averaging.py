"""Syncing less often: localsgd and diloco average models every --period steps; their equivalences, drift, time and
bytes to accuracy, and clear refusals."""

import json

import pytest
from conftest import losses, train_several
from disk_formats import write_mnist

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError

# Plain SGD (no momentum, no weight decay) on MNIST without dropout: one step of gradient averaging and one average
# of the models each rank stepped alone are the same arithmetic, up to float32 rounding.
PLAIN_SGD = ["--dataset", "mnist", "--batch-size", "64", "--max-steps", "6", "--log-every", "1", "--momentum", "0",
             "--weight-decay", "0", "--dropout", "0", "--lr", "0.05", "--lr-schedule", "constant",
             "--warmup-steps", "0", "--no-tracking"]
# The job's defaults (momentum, weight decay), averaging every 3 steps, a test evaluation every 4, replicas checked
# at every step (local SGD's last average and DiLoCo's outer state must agree everywhere)
EVERY_4 = ["--dataset", "mnist", "--batch-size", "64", "--epochs", "2", "--max-steps", "10", "--log-every", "2",
           "--eval-every", "4", "--check-every", "1", "--no-tracking"]
PERIODIC = [*EVERY_4, "--period", "3"]
# DiLoCo with two fragments averaged in turn (one every 2 steps), each sum in the background; few logged steps and
# replica checks, so the main thread's next steps (not its bookkeeping) run while a sum travels
OVERLAPPED = ["--dataset", "mnist", "--batch-size", "64", "--epochs", "2", "--log-every", "5", "--check-every", "5",
              "--no-tracking", "--sync", "diloco", "--period", "4", "--fragments", "2", "--overlap"]


def relative_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def np4(tmp_path_factory):
    """Every job of this file at np 4, in one mpirun."""
    tmp = tmp_path_factory.mktemp("averaging")
    data = ["--data-dir", str(write_mnist(tmp / "data", train=512, test=128))]
    jobs = {
        "allreduce": [*PLAIN_SGD, *data, "--sync", "allreduce"],
        "localsgd-h1": [*PLAIN_SGD, *data, "--sync", "localsgd", "--period", "1"],
        "diloco-h1": [*PLAIN_SGD, *data, "--sync", "diloco", "--period", "1", "--outer-lr", "1",
                      "--outer-momentum", "0"],
        "localsgd-h3": [*PERIODIC, *data, "--sync", "localsgd"],
        "localsgd-h3-start4": [*PERIODIC, *data, "--sync", "localsgd", "--local-start-step", "4",
                               "--local-momentum", "average"],
        "diloco-h3+powersgd": [*PERIODIC, *data, "--sync", "diloco", "--compression", "powersgd",
                               "--powersgd-start-step", "1"],
        "flat": [*EVERY_4, *data, "--sync", "flat"],
        # whole, with a timeline; then stopped at step 5 (the sum of step 4 in flight: the checkpoint carries it) and
        # resumed to 10
        "overlapped": [*OVERLAPPED, *data, "--max-steps", "10", "--timeline", "--timeline-dir", str(tmp / "timeline"),
                       "--run-name", "overlapped"],
        "overlapped-first": [*OVERLAPPED, *data, "--max-steps", "5", "--checkpoint-dir", str(tmp / "ck"),
                             "--checkpoint-every", "5"],
        "overlapped-resumed": [*OVERLAPPED, *data, "--max-steps", "10", "--checkpoint-dir", str(tmp / "ck"),
                               "--resume", "auto"],
    }
    summaries = train_several(4, tmp, jobs, timeout=600)
    summaries["overlapped-trace"] = json.loads((tmp / "timeline" / "overlapped.trace.json").read_text())
    return summaries


@pytest.mark.e2e
def test_local_sgd_of_period_1_is_gradient_averaging_and_diloco_of_outer_step_1_is_local_sgd(np4):
    reference = losses(np4["allreduce"])
    assert relative_gap(losses(np4["localsgd-h1"]), reference) <= 1e-5
    # an outer SGD step of rate 1 without momentum moves the anchor by exactly the mean change
    assert losses(np4["diloco-h1"]) == losses(np4["localsgd-h1"])
    assert np4["diloco-h1"]["weights_sha256"] == np4["localsgd-h1"]["weights_sha256"]
    assert reference[-1] < reference[0]  # it learned: equal curves are not equal constants


@pytest.mark.e2e
def test_ranks_drift_between_averages_and_the_drift_is_logged(np4):
    steps = np4["localsgd-h3"]["steps"]
    drifts = {s["step"]: s["drift"] for s in steps if "drift" in s}
    # averages at steps 3, 6, 9: the windows ending at 4, 6 and 10 hold one each; the one ending at 2 none
    assert sorted(drifts) == [4, 6, 10] and all(d > 0 for d in drifts.values())
    assert "drift" not in np4["flat"]["steps"][0]
    # DiLoCo's outer state and the last average agreed on every rank at every step (--check-every 1), or the job
    # would have failed; compressed, one plain average and three of PowerSGD's factors (under a fifth of the model
    # each) against local SGD's four whole ones
    compressed, whole = np4["diloco-h3+powersgd"]["evaluations"][-1], np4["localsgd-h3"]["evaluations"][-1]
    assert compressed["step"] == whole["step"] == 10 and compressed["sent_mb"] < whole["sent_mb"] / 2


@pytest.mark.e2e
def test_evaluations_carry_the_time_and_the_bytes_it_took_to_get_there(np4):
    local, flat = np4["localsgd-h3"], np4["flat"]
    assert [e["step"] for e in local["evaluations"]] == [4, 8, 10]  # every 4 steps, and the end
    assert local["evaluations"][-1]["test_accuracy"] == local["epochs"][-1]["test_accuracy"]
    elapsed = [e["elapsed_s"] for e in local["evaluations"]]
    assert elapsed == sorted(elapsed) and elapsed[-1] <= local["wall_time_s"]
    # bytes: flat sends the gradients at each of its 10 steps, localsgd the model at 3 averages and once more at the
    # end (10 is not a multiple of 3): 4 averages of as many bytes
    assert [e["step"] for e in flat["evaluations"]] == [4, 8, 10]  # (8: the end of epoch 1, of 8 steps)
    sent_flat, sent_local = flat["evaluations"][-1]["sent_mb"], local["evaluations"][-1]["sent_mb"]
    assert sent_local == pytest.approx(sent_flat * 4 / 10)
    assert local["evaluations"][0]["sent_mb"] == pytest.approx(sent_flat * 1 / 10)  # step 4: one average done


@pytest.mark.e2e
def test_the_warm_up_averages_gradients_and_the_momentum_can_be_averaged_too(np4):
    started = np4["localsgd-h3-start4"]
    # steps 1-4 sync gradients (each a sync), then averages at 7 and 10: 6 syncs of the model's bytes by step 10
    assert started["evaluations"][-1]["sent_mb"] == pytest.approx(np4["flat"]["evaluations"][-1]["sent_mb"] * 6 / 10)
    assert [s["step"] for s in started["steps"] if "drift" in s] == [8, 10]


@pytest.mark.e2e
def test_an_overlapped_average_runs_under_the_next_steps_and_resumes_exactly(np4):
    events = [e for e in np4["overlapped-trace"]["traceEvents"] if e.get("ph") == "X"]

    def during(interval: dict, others: list[dict]) -> float:
        # microseconds of the interval that the others cover
        return sum(max(0.0, min(interval["ts"] + interval["dur"], o["ts"] + o["dur"]) - max(interval["ts"], o["ts"]))
                   for o in others)

    under_compute, held = 0, 0
    for rank in range(4):
        mine = [e for e in events if e["pid"] == rank]
        sums = [e for e in mine if e["cat"] == "background"]
        launches = [e for e in mine if e["cat"] == "phase" and e["name"] == "average"]
        compute = [e for e in mine if e["name"] in ("forward", "backward")]
        # a fragment's turn every 2 steps: 5 sums in 10 steps, each merged at the next turn (the last at the end)
        assert len(sums) == 5 and all(e["name"] == "average" for e in sums)
        # the main thread hands each sum over and goes on: sums run on past their average phases. A short sum may
        # end inside one while four ranks share two cores and the main thread waits for a core, but a main thread
        # that waited for its sums would hold every one
        inside = sum(during(m, launches) >= m["dur"] for m in sums)
        assert inside < len(sums), f"rank {rank}: every sum held the main thread"
        held += inside
        under_compute += sum(during(m, compute) > 0 for m in sums)
    assert held <= 4 * 5 // 2, f"{held} of the 20 sums held the main thread"
    # and the main thread computes later steps under some of them (which ones depends on how 4 ranks share the
    # cores: a rank may spend a sum's whole time waiting for the others' step)
    assert under_compute > 0, "no sum ran under a later step's forward or backward"
    whole, first, resumed = np4["overlapped"], np4["overlapped-first"], np4["overlapped-resumed"]
    assert resumed["resumed_from"]["step"] == 5
    assert losses(first) == [s["loss"] for s in whole["steps"] if s["step"] <= 5]
    assert losses(resumed) == [s["loss"] for s in whole["steps"] if s["step"] > 5]
    assert resumed["weights_sha256"] == whole["weights_sha256"]  # bit for bit, the in-flight sum included
    assert resumed["epochs"][-1]["test_accuracy"] == whole["epochs"][-1]["test_accuracy"]


def test_the_averaging_flags_are_refused_where_nothing_reads_them_or_out_of_range():
    with pytest.raises(UserError, match=r"--period is read by --sync localsgd and diloco only.*--sync allreduce"):
        TrainConfig(sync="allreduce", period=4).validate(world_size=2)
    with pytest.raises(UserError, match=r"--outer-lr is read by --sync diloco only"):
        TrainConfig(sync="localsgd", outer_lr=0.5).validate(world_size=2)
    with pytest.raises(UserError, match=r"--period must be at least 1"):
        TrainConfig(sync="localsgd", period=0).validate(world_size=2)
    with pytest.raises(UserError, match=r"--host-period 8 must be shorter than --period 8"):
        TrainConfig(sync="diloco", host_period=8).validate(world_size=2)
    with pytest.raises(UserError, match=r"--outer-momentum must be in \[0, 1\)"):
        TrainConfig(sync="diloco", outer_momentum=1.0).validate(world_size=2)
    with pytest.raises(UserError, match=r"--eval-every must be positive"):
        TrainConfig(eval_every=0).validate(world_size=2)
    TrainConfig(sync="diloco", period=16, host_period=4, outer_lr=0.5, local_momentum="reset").validate(world_size=2)
