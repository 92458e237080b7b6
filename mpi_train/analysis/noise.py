"""The rule that decides when two timings differ at all, and when a model's fit is too rough to judge by.

Two figures that differ by less than the machine's noise (NOISE_RULE) get no verdict: a speed-up or a model's error
of a few milliseconds on a shared CPU says nothing. A plot whose model fitted its own calibration worse than
FIT_ERROR_ROUGH says so in its title.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

WITHIN_NOISE = "within-noise"  # in place of a verdict (a speed-up, a model's error) that the noise decides

# The noise rule: below NOISE_FLOOR_S a difference is the per-call overhead of Python and the backend on a shared CPU,
# which the model does not price; a run's own step times stray by its spread, and a difference inside NOISE_SPREADS
# spreads of either figure's run is the machine's, not the method's.
NOISE_FLOOR_S = 0.005
NOISE_SPREADS = 2
NOISE_RULE = (f"within noise = two figures that differ by less than max({1000 * NOISE_FLOOR_S:.0f} ms, "
              f"{NOISE_SPREADS} x the step-time spread of the runs they come from) get no verdict; spread = the "
              f"standard deviation of a run's logged step times after its timing warm-up (none for a run with fewer "
              f"than two: the {1000 * NOISE_FLOOR_S:.0f} ms alone), a bench's of a method's step minus the no-sync "
              f"step; under {1000 * NOISE_FLOOR_S:.0f} ms a difference is the per-call overhead the model does not "
              f"price")
FIT_ERROR_ROUGH = 0.20  # a fit off its own calibration points by more than the lab's ±20% target cannot meet it


def spread(values: Sequence[float]) -> float | None:
    """The standard deviation of a figure over steps; None below two."""
    return statistics.stdev(values) if len(values) >= 2 else None


def noise_bound(*spreads: float | None) -> float:
    """The smallest difference NOISE_RULE gives a verdict on, for figures from runs of these spreads."""
    return max([NOISE_FLOOR_S] + [NOISE_SPREADS * s for s in spreads if s is not None and math.isfinite(s)])


def within_noise(figure: float, reference: float, *spreads: float | None) -> bool:
    """Whether two figures differ by less than the noise of the runs they come from (NOISE_RULE): no verdict."""
    return abs(figure - reference) < noise_bound(*spreads)


def fit_note(fit_error: float | None, what: str = "model", figures: str = "predictions") -> str | None:
    """What a plot of a model's `figures` says on its face when the calibration fit of its `what` is rough or
    unknown; None when the fit is within FIT_ERROR_ROUGH."""
    if fit_error is None:
        return f"{what} fit error not recorded: {figures} unchecked"
    if fit_error > FIT_ERROR_ROUGH:
        return f"{what} fit error {100 * fit_error:.0f}% (over {100 * FIT_ERROR_ROUGH:.0f}%): {figures} are rough"
    return None
