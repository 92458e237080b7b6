"""--accumulate K: K micro-batches per optimizer step, the sync once after the last, equal one batch of the same
global size to float32 precision for every lossless method (DDP and zero_torch through no_sync(), bucketed and zero by
holding their hooks, fsdp through set_requires_gradient_sync)."""

import pytest
from conftest import losses, train_several

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError

# The MNIST CNN without dropout and without BatchNorm: nothing in a step depends on how the batch is split.
JOB = ["--dataset", "synthetic", "--synthetic-size", "512", "--batch-size", "64", "--max-steps", "4", "--log-every",
       "1", "--dropout", "0", "--no-tracking"]
LOSSLESS = ("gather_scatter", "allreduce", "flat", "bucketed", "ring", "hierarchical", "ddp", "zero", "fsdp",
            "zero_torch")


def relative_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == 4
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.mark.e2e
@pytest.mark.parametrize("np, methods", [(2, LOSSLESS), (4, ("allreduce", "bucketed", "ddp"))])
def test_k_micro_batches_equal_one_batch_of_the_same_global_size(tmp_path, np, methods):
    jobs = {"whole": [*JOB, "--sync", "allreduce"],
            **{f"{method}-k4": [*JOB, "--sync", method, "--accumulate", "4"] for method in methods}}
    runs = train_several(np, tmp_path, jobs)
    whole = losses(runs["whole"])
    for method in methods:
        accumulated = runs[f"{method}-k4"]
        assert accumulated["config"]["accumulate"] == 4 and accumulated["batch_size_per_rank"] == 64 // np
        assert relative_gap(losses(accumulated), whole) <= 1e-5, method
        assert accumulated["mean_times"]["sync_time_s"] >= 0


def test_micro_batches_must_split_each_ranks_share():
    with pytest.raises(UserError, match=r"--accumulate 3 splits each rank's 32 samples.*a multiple of 6"):
        TrainConfig(batch_size=64, accumulate=3).validate(world_size=2)
    with pytest.raises(UserError, match="--accumulate must be positive"):
        TrainConfig(accumulate=0).validate(world_size=1)
    TrainConfig(batch_size=64, accumulate=4).validate(world_size=4)  # 16 a rank, 4 micro-batches of 4
