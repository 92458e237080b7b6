"""The phase clocks of training and the bench: perf_counter, with the GPU's own timestamps where there is one."""

from __future__ import annotations

import time

import torch


class Clock:
    """perf_counter that first waits for queued GPU work, so phases are charged correctly (the bench's: it times
    one thing at a time)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class StepClock:
    """The boundaries of one training step's phases, read once at its end.

    On CPUs a mark is perf_counter when it is made. On CUDA it is an event on the current stream, so the host
    never waits mid-step (a synchronisation at every boundary drains the queue and leaves the GPU idle while the
    next kernels are launched); `read` waits once, for the step's last mark, and gives each mark as the
    perf_counter time at which the GPU reached it, from the step's first mark (made with the GPU idle: the
    previous step's read waited for it).
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []
        self.started = 0.0

    def start(self) -> int:
        """The step's first mark (0)."""
        self.marks = []
        self.started = time.perf_counter()
        return self.mark()

    def mark(self) -> int:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        return len(self.marks) - 1

    def read(self) -> list[float]:
        """Every mark of the step, in perf_counter seconds."""
        if not self.cuda:
            return list(self.marks)
        first, last = self.marks[0], self.marks[-1]
        last.synchronize()
        return [self.started + first.elapsed_time(event) / 1e3 for event in self.marks]
