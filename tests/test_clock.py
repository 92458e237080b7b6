"""The step clock on CPUs: marks in order, read as perf_counter seconds, a fresh list each step."""

import time

import torch

from mpi_train.clock import StepClock


def test_marks_read_back_in_order_and_start_afresh():
    clock = StepClock(torch.device("cpu"))
    first = clock.start()
    time.sleep(0.01)
    later = clock.mark()
    at = clock.read()
    assert (first, later) == (0, 1) and at[1] - at[0] >= 0.01
    assert clock.start() == 0 and len(clock.read()) == 1
