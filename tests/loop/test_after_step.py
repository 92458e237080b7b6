"""A rank's phase totals: each step's times added, their means over the steps counted."""

import pytest

from mpi_train.loop.after_step import PhaseTotals
from mpi_train.tracking.names import PHASES


def test_phase_totals_mean_each_phase_over_the_steps_added():
    totals = PhaseTotals()
    assert totals.means() == dict.fromkeys(PHASES, 0.0)
    totals.add(dict.fromkeys(PHASES, 1.0))
    totals.add({**dict.fromkeys(PHASES, 3.0), "sync_time_s": 0.5})
    means = totals.means()
    assert totals.steps == 2 and means["step_time_s"] == pytest.approx(2.0)
    assert means["sync_time_s"] == pytest.approx(0.75)
