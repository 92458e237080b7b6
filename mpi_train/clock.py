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
    """The boundaries of each training step's phases, read after the step without stopping the host.

    On CPUs a mark is perf_counter when it is made, and a step is read as soon as it closes. On CUDA a mark is an
    event on the current stream, and a closed step is read only once the next one has been queued: the host never
    waits for the GPU to finish the step it has just launched, so it queues the next step's kernels while the GPU
    runs this one's, as a bare PyTorch loop does (waiting every step cost VGG-11 on an H200 1.25 ms of a 5.3 ms
    step). Each mark reads as the perf_counter time at which the GPU reached it, through an anchor: an event
    recorded with the GPU idle, at the first step and again at every `drain`.
    """

    def __init__(self, device: torch.device, lagged: bool | None = None):
        self.cuda = device.type == "cuda"
        self.lagged = self.cuda if lagged is None else lagged  # a step read once the next has closed (CUDA's way)
        self.marks: list = []
        self.pending: list = []  # closed steps not read yet: (marks, finish); when lagged, the newest one at most
        self.anchor: tuple | None = None  # (event, perf_counter when the GPU reached it)
        self.spare: list = []  # CUDA events whose steps have been read, to record again (each new one costs the host)

    def start(self) -> int:
        """The step's first mark (0)."""
        if self.cuda and self.anchor is None:
            self._anchor()
        self.marks = []
        return self.mark()

    def mark(self) -> int:
        if self.cuda:
            event = self.spare.pop() if self.spare else torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        return len(self.marks) - 1

    def close(self, finish) -> list:
        """The step is over: `finish(at)` makes its figures from every mark in perf_counter seconds. Returns the
        figures of the steps read now: this one on CPUs; on CUDA the one before it, if any."""
        self.pending.append((self.marks, finish))
        if not self.lagged:
            return self.drain()
        newest = self.pending.pop()
        read, self.pending = self._read(self.pending), [newest]
        return read

    def drain(self) -> list:
        """Every closed step's figures, waiting for the GPU where it has not reached them yet."""
        read, self.pending = self._read(self.pending), []
        if self.cuda and read:
            self._anchor()
        return read

    def _read(self, steps: list) -> list:
        if not self.cuda:
            return [finish(marks) for marks, finish in steps]
        event, host = self.anchor
        figures = []
        for marks, finish in steps:
            marks[-1].synchronize()
            figures.append(finish([host + event.elapsed_time(mark) / 1e3 for mark in marks]))
            self.spare.extend(marks)
        return figures

    def _anchor(self) -> None:
        torch.cuda.synchronize()
        event = torch.cuda.Event(enable_timing=True)
        host = time.perf_counter()  # the GPU is idle: it reaches the event as soon as it is queued
        event.record()
        event.synchronize()
        self.anchor = (event, host)
