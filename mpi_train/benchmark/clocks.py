"""Clocks that a benchmark's steps feed: a compressor's own CPU work, and when backward has each gradient ready."""

from __future__ import annotations

import statistics

from torch import nn

from .. import netmodel
from ..clock import Clock
from ..timeline import Recorder


class CodecClock(Recorder):
    """Adds up a compressor's work between its sums, the codec intervals a timeline draws: its CPU time as the
    synced step pays it (sharing the cores with the other ranks, and with backward for a method that compresses
    in backward)."""

    detailed = True  # the methods note their codec intervals only for a recorder that wants them
    wants_messages = False

    def __init__(self):
        self.seconds, self.intervals = 0.0, []

    def codec(self, start: float, end: float, bucket: int | None = None) -> None:
        self.seconds += end - start
        self.intervals.append(end - start)

    def take(self) -> tuple[float, list[float]]:
        """The seconds since the last take, in all and interval by interval."""
        taken = self.seconds, self.intervals
        self.seconds, self.intervals = 0.0, []
        return taken


class BackwardClock:
    """When each gradient of a model is ready during backward (hooks on its parameters), as shares of backward:
    what an overlapped method's buckets wait for, measured instead of assumed (netmodel.Backward)."""

    def __init__(self, model: nn.Module, now: Clock):
        self.now, self.ready_at, self.shares, self.order = now, {}, [], None
        self.params = [p for p in model.parameters() if p.requires_grad]
        for index, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(self.hook(index))

    def hook(self, index: int):
        def ready(_param) -> None:
            self.ready_at[index] = self.now()
        return ready

    def record(self, start: float, end: float) -> None:
        """One timed backward from `start` to `end`: each gradient's share of it."""
        length = max(end - start, 1e-9)
        self.shares.append([min(1.0, max(0.0, (self.ready_at.get(i, end) - start) / length))
                            for i in range(len(self.params))])
        if self.order is None:  # autograd's order, as it came (ready times of one node's tensors can tie)
            self.order = tuple(self.ready_at)
        self.ready_at.clear()

    def profile(self, share: float) -> netmodel.Backward:
        """The median share per gradient over the recorded steps, with backward's `share` of compute, and the order
        the gradients came in."""
        return netmodel.Backward(share, tuple(statistics.median(column) for column in zip(*self.shares)), self.order)
