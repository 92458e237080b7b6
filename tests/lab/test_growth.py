"""Whether growing pays: the step time read from the job's printed steps, the time the steps left would save
against a relaunch's cost, and no interruption within a few steps of the end."""

from __future__ import annotations

import time

from mpi_train.lab.growth import NEAR_END_STEPS, GrowthCase, Progress
from mpi_train.lab.launchline import Placement


def test_the_step_time_is_the_pace_of_the_last_printed_steps():
    progress = Progress()
    progress.read("mpi_train: 2 rank(s) on 1 host(s)\n")
    progress.read("epoch 1 step     5/40  loss 2.3264  lr 0.0125  step 0.557s\n")
    assert progress.now() is None  # one step line: no pace yet
    time.sleep(0.2)
    progress.read("epoch 1 step     7/40  loss 2.3  step 0.5s\n")
    step, total, step_s = progress.now()
    assert (step, total) == (7, 40) and 0.09 <= step_s <= 0.5
    assert progress.first_at() is not None


def test_growing_pays_when_the_steps_left_save_more_than_a_relaunch_and_never_near_the_end():
    case = GrowthCase(step=10, total_steps=110, step_s=1.0, ranks=2, grown_ranks=4, relaunch_s=30,
                      cost_source="measured")
    assert case.grown_step_s == 0.5 and case.saved_s == 50 and case.pays
    assert case.line("Host(s) h2 returned") == ("Host(s) h2 returned ready: step 1.00 s on 2 ranks, about 0.50 s on 4; "
                                                "100 steps left save about 50 s against a relaunch of 30 s (measured): "
                                                "growing.")
    costly = GrowthCase(step=10, total_steps=110, step_s=1.0, ranks=2, grown_ranks=4, relaunch_s=60,
                        cost_source="assumed")
    assert not costly.pays and costly.line("H").endswith("(assumed): not growing.")
    near = GrowthCase(step=110 - NEAR_END_STEPS, total_steps=110, step_s=100.0, ranks=2, grown_ranks=4,
                      relaunch_s=1, cost_source="measured")
    assert not near.pays and near.line("H").endswith(f"within {NEAR_END_STEPS} of the end: not growing.")


def test_more_hosts_give_the_most_ranks_that_split_the_global_batch_up_to_max_ranks():
    shrunk = Placement((("a", 2),), 2, 64)
    assert shrunk.more((("b", 2),), max_ranks=4) == Placement((("a", 2), ("b", 2)), 4, 64)
    assert shrunk.more((("b", 8),), max_ranks=16).ranks == 8  # 10 slots, and 64 splits 8 ways, not 10
    assert shrunk.more((("b", 2),), max_ranks=2) is None  # already at --max-ranks
    odd = Placement((("a", 2),), 2, 96, accumulate=2)
    assert odd.more((("b", 3),), max_ranks=8).ranks == 4  # 5 slots; 96 splits into 4 shares of 2 micro-batches
