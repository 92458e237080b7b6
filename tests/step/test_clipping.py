"""--clip-grad-norm: the norm of a known gradient, the clipped result against torch's own clip_grad_norm_, and the
norm of a gradient cut into shards against the whole's."""

import math

import pytest
import torch
from torch import nn

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.step.clipping import EPSILON, clip_, local_norm

CPU = torch.device("cpu")


def test_a_gradient_above_the_limit_is_scaled_to_it_and_one_below_is_left_alone():
    gradients = [torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])]  # norm 5
    norm = local_norm(gradients, CPU)
    assert norm.item() == 5.0 and norm.dtype == torch.float64
    clip_(gradients, norm, 1.0)
    factor = 1.0 / (5.0 + EPSILON)
    assert gradients[0].tolist() == pytest.approx([3.0 * factor, 0.0], rel=1e-7)
    assert gradients[1].item() == pytest.approx(4.0 * factor, rel=1e-7)
    assert math.hypot(*gradients[0].tolist(), gradients[1].item()) == pytest.approx(1.0, rel=1e-6)
    below = [torch.tensor([0.3, -0.4])]
    before = below[0].clone()
    clip_(below, local_norm(below, CPU), 1.0)
    assert torch.equal(below[0], before)  # times exactly 1


def test_clipping_a_models_gradients_matches_torchs_clip_grad_norm():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 5))
    model(torch.randn(8, 20)).square().sum().backward()
    ours = [p.grad.clone() for p in model.parameters()]
    norm = local_norm(ours, CPU)
    clip_(ours, norm, 0.05)
    theirs = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    assert norm.item() == pytest.approx(theirs.item(), rel=1e-6)
    for mine, grad in zip(ours, (p.grad for p in model.parameters())):
        torch.testing.assert_close(mine, grad, rtol=1e-6, atol=0)


def test_the_norm_of_a_gradient_cut_into_shards_is_the_wholes():
    """What zero and fsdp compute: each shard's norm, squared, summed across ranks (here, two halves and a ragged
    three-way cut), the root taken; in float64, the same as the whole's to far below float32's rounding, where a
    float32 sum over a million numbers on a CPU is off by about 1e-4, differently for each cut."""
    torch.manual_seed(0)
    whole = [torch.randn(1_179_648) * 1e-3, torch.randn(128) * 10.0]
    expected = local_norm(whole, CPU).item()
    flat = torch.cat(whole)
    for cuts in ([flat.numel() // 2], [7, 600_000]):
        shards = torch.tensor_split(flat, cuts)
        summed = sum(local_norm([shard], CPU).square() for shard in shards).sqrt().item()
        assert summed == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(flat.double().norm().item(), rel=1e-12)


@pytest.mark.parametrize("limit", [0.0, -1.0])
def test_a_limit_of_zero_or_below_is_refused(limit):
    with pytest.raises(UserError, match=rf"--clip-grad-norm must be positive, got {limit}\. Pass a value greater "
                                        r"than zero\."):
        TrainConfig(clip_grad_norm=limit).validate(world_size=1)
    TrainConfig(clip_grad_norm=0.05).validate(world_size=1)
