"""Finished jobs as the comparison reads them: the step times their spread is taken over."""

from mpi_train.analysis.finished_jobs import FinishedJob, steady_step_times, summary_step_times


def test_a_run_s_spread_leaves_out_the_windows_that_hold_warm_up_steps():
    # logged every step, warm-up 1: step 1 (start-up) is left out, steps 2..4 give the spread
    assert steady_step_times([(1, 0.671), (2, 0.230), (3, 0.240), (4, 0.250)], 1) == [0.230, 0.240, 0.250]
    # logged every 2 steps: the window of steps 1-2 holds the warm-up; one window left gives no spread
    assert steady_step_times([(2, 0.119), (4, 0.079)], 1) == [0.079]
    one_window = FinishedJob(run_id="a", name="a", sync="ring", world_size=2, metrics={}, step_times=[0.079])
    assert one_window.step_spread_s is None
    assert summary_step_times({"timing_warmup_steps": 0, "steps": [{"step": 2, "step_time_s": 0.1},
                                                                   {"step": 4, "step_time_s": 0.3}]}) == [0.1, 0.3]

