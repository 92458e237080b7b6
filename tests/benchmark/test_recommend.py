"""What the advisor makes of its measurements: the full bench's regret and Kendall's tau, and a recommendation that
the bench's noise does not overturn."""

import pytest

from mpi_train import netmodel
from mpi_train.advice.search import Candidate, StepModel
from mpi_train.benchmark.advice_report import describe_full_bench
from mpi_train.benchmark.contenders import NO_SYNC
from mpi_train.benchmark.recommend import NOISE_FLOOR, bench_noise, full_bench_check, recommendation


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
    check = full_bench_check(grid, per_rank, 12.0, model, "bucketed@4MB", 3)
    assert check["fastest"] == "allreduce" and check["regret"] == pytest.approx(0.1)
    assert [row["label"] for row in check["configurations"]] == ["allreduce", "bucketed@4MB", "gather_scatter"]
    predicted = {row["label"]: row["predicted_step_s"] for row in check["configurations"]}
    assert predicted["bucketed@4MB"] < predicted["allreduce"] < predicted["gather_scatter"]  # overlapped: hidden
    assert check["kendall_tau"] == pytest.approx(1 / 3) and check["no_sync_step_s"] == pytest.approx(1.01)
    text = "\n".join(describe_full_bench(check))
    assert "regret +10.0%" in text and "0.33 over every configuration" in text


def test_a_measured_difference_within_the_bench_noise_does_not_overturn_the_model():
    def row(label, predicted, measured):
        candidate = Candidate("bucketed", float(label[9:-2])) if "@" in label else Candidate(label)
        return {**candidate.as_dict(), "predicted_step_s": predicted, "predicted_exposed_s": 0.1,
                "predicted_comm_s": 0.3, "measured_step_s": measured, "binds": "the between-host link"}

    model = StepModel((4e6,), netmodel.Layout(4, 2), netmodel.Network(netmodel.Link(0, 1e-9), netmodel.Link(0, 1e-8)),
                      netmodel.ASSUMED_BACKWARD, 1.0, 1.0)
    assert bench_noise([2.0, 2.02]) == NOISE_FLOOR and bench_noise([2.0, 2.5, 2.0]) == 0.25
    close = {"bucketed@8MB": row("bucketed@8MB", 1.1, 1.30), "ddp": row("ddp", 1.2, 1.28)}
    kept = recommendation(close, "bucketed@8MB", model, noise=0.03)
    assert kept["label"] == "bucketed@8MB" and "within the bench's noise (3%" in kept["why"]
    far = {"bucketed@8MB": row("bucketed@8MB", 1.1, 1.30), "ddp": row("ddp", 1.2, 1.20)}
    overturned = recommendation(far, "bucketed@8MB", model, noise=0.03)
    assert overturned["label"] == "ddp" and "slower by more than the bench's noise (3%)" in overturned["why"]
    assert recommendation(far, "bucketed@8MB", model, noise=0.1)["label"] == "bucketed@8MB"
