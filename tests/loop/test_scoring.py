"""The wall time to accuracy: a resumed job's time carried on, its test evaluations left out."""

import time

from mpi_train.loop.scoring import Progress


def test_progress_carries_a_resumed_jobs_time_and_leaves_out_the_evaluations():
    progress = Progress(elapsed_s=5.0)
    with progress.evaluating():
        time.sleep(0.2)
    assert 5.0 <= progress.elapsed() < 5.1
    assert progress.evaluating_s >= 0.2
