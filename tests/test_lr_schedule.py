"""The learning-rate schedule and the per-model optimizer defaults, checked against closed forms."""

import itertools
import math

import pytest
import torch

from mpi_train.commands.train import parse_config
from mpi_train.errors import UserError
from mpi_train.lr_schedule import MODEL_DEFAULTS, LearningRate, lr_factor


def test_warm_up_ramps_linearly_to_the_peak():
    assert [lr_factor(step, "cosine", 4, 100) for step in (1, 2, 3, 4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(5, "cosine", 4, 100) == 1.0  # the first step after warm-up runs at the peak


def test_cosine_decays_to_zero_over_the_steps_after_warm_up():
    factors = [lr_factor(step, "cosine", 10, 110) for step in range(11, 111)]
    assert all(a > b for a, b in itertools.pairwise(factors))
    assert factors[50] == pytest.approx(0.5)  # halfway through the decay
    assert factors[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 99 / 100)))
    assert lr_factor(500, "cosine", 10, 110) == pytest.approx(0.0)  # past the end (more epochs than planned)


def test_step_decay_divides_by_ten_at_half_and_three_quarters():
    factors = [lr_factor(step, "step", 0, 100) for step in range(1, 101)]
    assert factors[:50] == [1.0] * 50
    assert factors[50:75] == [pytest.approx(0.1)] * 25
    assert factors[75:] == [pytest.approx(0.01)] * 25


def test_the_course_settings_keep_one_rate_throughout():
    assert {lr_factor(step, "constant", 0, 196) for step in range(1, 197)} == {1.0}


def test_a_resumed_schedule_continues_exactly_where_it_stopped():
    def rates(steps_done: int, count: int) -> list[float]:
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=123.0)
        schedule = LearningRate(optimizer, 0.1, "cosine", 5, 30, steps_done=steps_done)
        seen = []
        for _ in range(count):
            seen.append(optimizer.param_groups[0]["lr"])
            schedule.step()
        return seen

    assert rates(0, 30)[12:] == rates(12, 18)
    assert rates(0, 3) == pytest.approx([0.02, 0.04, 0.06])


def test_each_model_gets_its_defaults_unless_a_flag_overrides_them():
    vgg = parse_config(["--dataset", "cifar10"])
    assert vgg.optimizer_settings == MODEL_DEFAULTS["vgg11"][0]
    mnist = parse_config(["--dataset", "mnist", "--lr", "0.2", "--warmup-steps", "0"])
    assert (mnist.optimizer_settings.lr, mnist.optimizer_settings.warmup_steps) == (0.2, 0)
    assert mnist.optimizer_settings.momentum == MODEL_DEFAULTS["mnist_cnn"][0].momentum
    resolved = mnist.as_dict()
    assert (resolved["lr"], resolved["warmup_steps"], resolved["lr_schedule"]) == (0.2, 0, "cosine")


@pytest.mark.parametrize("flag, value", [("--warmup-steps", "-1"), ("--timing-warmup-steps", "-2"), ("--lr", "0")])
def test_negative_warm_ups_and_a_zero_rate_are_rejected(flag, value):
    with pytest.raises(UserError, match=flag):
        parse_config([flag, value]).validate(1)


def test_an_unknown_schedule_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--lr-schedule", "linear"])
    assert "constant" in capsys.readouterr().err
