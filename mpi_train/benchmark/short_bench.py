"""The advisor's timed runs: the model without sync, the shortlist beside a no-sync baseline, and the full bench,
each on fresh replicas of one template model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..advice.search import Candidate
from .contenders import NO_SYNC, NoSync, contender
from .measure import measure

PROFILE_STEPS = 2  # timed steps of the model without sync, for the predictions that pick what to measure
FULL_BENCH_CHUNK = 5  # configurations measured side by side in --full-bench (each holds a replica of the model)

Progress = Callable[[int, int, bool], None]


@dataclass(frozen=True)
class ShortBench:
    """What every timed run of the advisor shares: the model it copies, the batch, the warm-up, the device and the
    precision the job computes in."""

    template: nn.Module
    images: torch.Tensor
    labels: torch.Tensor
    warmup: int
    device: torch.device
    precision: str

    def profile(self, progress: Progress) -> tuple[dict, tuple[int, ...] | None]:
        """This rank's times of the model without sync, after one warm-up step, and the order its gradients came
        in."""
        entries = [contender(NO_SYNC, NoSync(), self.template)]
        return measure(entries, self.images, self.labels, PROFILE_STEPS, 1, self.device, progress, self.precision)

    def time(self, candidates: Sequence[Candidate], steps: int, progress: Progress) -> dict:
        """This rank's times of `candidates` beside a no-sync baseline, round robin."""
        entries = [contender(NO_SYNC, NoSync(), self.template)] + [
            contender(c.label, c.method(self.precision), self.template) for c in candidates]
        times, _ = measure(entries, self.images, self.labels, steps, self.warmup, self.device, progress,
                           self.precision)
        return times

    def full(self, grid: Sequence[Candidate], steps: int, progress: Callable[[str], Progress]) -> dict:
        """This rank's times of every configuration of `grid`, a few replicas at a time (8 ranks on one machine
        fit), merged as one run's."""
        merged: dict[str, dict[str, list[float]]] = {}
        for first in range(0, len(grid), FULL_BENCH_CHUNK):
            chunk = grid[first:first + FULL_BENCH_CHUNK]
            times = self.time(chunk, steps, progress(f"full bench {first + 1}-{first + len(chunk)} of {len(grid)}"))
            for name, phases in times.items():
                for phase, values in phases.items():
                    merged.setdefault(name, {}).setdefault(phase, []).extend(values)
        return merged


def say_progress(is_main: bool, what: str) -> Progress:
    """Rank 0 prints each step of the advisor's `what` (the other ranks stay quiet)."""
    def say(step: int, total: int, warming: bool) -> None:
        if is_main:
            print(f"advise: {what} step {step}/{total}{'  (warm-up)' if warming else ''}", flush=True)
    return say
