"""The noise rule: the floor, or the larger of the runs' spreads."""

from mpi_train.analysis.noise import NOISE_FLOOR_S, NOISE_SPREADS, noise_bound, within_noise


def test_the_noise_rule_takes_the_floor_or_the_larger_spread():
    assert noise_bound() == NOISE_FLOOR_S and noise_bound(None, float("nan")) == NOISE_FLOOR_S
    assert noise_bound(0.001) == NOISE_FLOOR_S  # a quiet run: the per-call overhead still bounds it
    assert noise_bound(0.010, 0.020) == NOISE_SPREADS * 0.020
    assert within_noise(0.0235, 0.0242, 0.004) and not within_noise(0.0235, 0.0015, 0.004)

