"""The timed steps and what every rank's times say: the codec intervals, the pooled backward profile, and the
compute timed in the job's precision."""

import pytest
import torch

from mpi_train import netmodel
from mpi_train.benchmark.contenders import NO_SYNC, Contender, NoSync
from mpi_train.benchmark.measure import codec_after_backward, measure, pooled_backward


def test_each_codec_interval_is_the_slowest_rank_s_then_the_median_over_steps():
    def rank(*steps):
        return {"bucketed+powersgd": {"codec_intervals": [list(step) for step in steps]}}

    ranks = [rank((1.0, 5.0), (3.0, 1.0), (2.0, 2.0)), rank((2.0, 1.0), (1.0, 4.0), (2.0, 9.0))]
    assert codec_after_backward(ranks, "bucketed+powersgd") == [2.0, 5.0]  # medians of (2, 3, 2), (5, 4, 9)
    uneven = [rank((1.0, 5.0)), rank((1.0, 5.0, 0.5))]  # a bucket launched after backward on one rank
    assert codec_after_backward(uneven, "bucketed+powersgd") is None


def test_the_backward_profile_pools_every_rank_s_steps():
    """Rank 0 saw the first gradient at 20% and 40% of backward, rank 1 at 80% twice: the median of all four."""
    def rank(ready):
        return {NO_SYNC: {"compute": [3.0, 3.0], "backward": [2.0, 1.0], "ready": [[r, 1.0] for r in ready]}}

    profile = pooled_backward([rank([0.2, 0.4]), rank([0.8, 0.8])], (1, 0))
    assert profile.ready == (pytest.approx(0.6), 1.0) and profile.order == (1, 0)
    assert profile.share == pytest.approx(0.5)  # the median of 2/3, 1/3, 2/3 and 1/3
    unmeasured = [{NO_SYNC: {"compute": [], "backward": []}}]
    assert pooled_backward(unmeasured, None) is netmodel.ASSUMED_BACKWARD


@pytest.mark.parametrize("precision, dtype", [("32-true", "float32"), ("bf16-mixed", "bfloat16")])
def test_the_compute_is_timed_in_the_jobs_precision(one_rank_group, precision, dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 10))
    computed = []
    model[1].register_forward_hook(lambda module, inputs, output: computed.append(str(output.dtype)))
    entries = [Contender(name=NO_SYNC, method=NoSync(), model=model, net=model)]
    times, _ = measure(entries, torch.randn(4, 3, 2, 2), torch.randint(0, 10, (4,)), 2, 1, torch.device("cpu"),
                       lambda *progress: None, precision)
    assert computed == [f"torch.{dtype}"] * 3 and len(times[NO_SYNC]["compute"]) == 2
    assert model[1].weight.grad.dtype == torch.float32  # the weights and their gradients stay float32
