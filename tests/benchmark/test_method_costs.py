"""What each method costs, from per-rank times: the step from barrier to barrier, and an overlapped method's wait
on the rank that finished backward last."""

import pytest

from mpi_train.benchmark.contenders import NO_SYNC
from mpi_train.benchmark.method_costs import summarise


def test_an_overlapped_step_is_timed_barrier_to_barrier_not_as_the_slowest_compute_plus_the_slowest_sync():
    """Rank 0 ends backward at 2.0 s and waits 0.4 s for its buckets; rank 1 ends backward at 2.4 s and waits for
    nothing: both end the step at 2.4 s, which is what the step costs, not 2.4 + 0.4."""
    def rank(compute, sync):
        return {NO_SYNC: {"compute": [2.0] * 4, "sync": [0.0] * 4, "step": [2.0] * 4},
                "bucketed": {"compute": [compute] * 4, "sync": [sync] * 4, "step": [2.4] * 4}}

    rows = {row["method"]: row for row in summarise([rank(2.0, 0.4), rank(2.4, 0.0)], 1000, 2, 1e6)}
    assert rows["bucketed"]["step_s"] == pytest.approx(2.4)
    assert rows["bucketed"]["exposed_s"] == pytest.approx(0.4)
    assert rows["bucketed"]["compute_s"] == pytest.approx(2.4) and rows["bucketed"]["sync_s"] == pytest.approx(0.4)
    # rank 1 finished backward last and waited for nothing: the step's 0.4 s is backward slowed, not the wire
    assert rows["bucketed"]["after_backward_s"] == pytest.approx(0.0)
    assert rows[NO_SYNC]["after_backward_s"] is None


