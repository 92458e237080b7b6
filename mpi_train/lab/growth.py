"""Whether growing a supervised job onto more ranks pays: the time the remaining steps save against what a
relaunch costs, from the job's own printed steps.

A relaunch costs what --relaunch-cost says, or what the job's last relaunch took, from asking
it to stop (or its launch) to its first step (60 s before one). The step time after growing is
the step time now scaled by the ranks (each rank's share of the global batch shrinks; the
sync's cost is left out, so the estimate favours growing on a slow network). A job within
NEAR_END_STEPS of its end is not interrupted.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

NEAR_END_STEPS = 5
STEP_LINE = re.compile(r"\bstep\s+(\d+)/(\d+)\b")
SLOPE_LINES = 5  # the printed steps the step time is measured over


class Progress:
    """The steps a launch printed, each with when it came (thread-safe: the output readers feed it)."""

    def __init__(self):
        self.seen: list[tuple[float, int, int]] = []  # (monotonic time, step, total steps)
        self.lock = threading.Lock()

    def read(self, text: str) -> None:
        found = STEP_LINE.search(text)
        if found:
            with self.lock:
                self.seen.append((time.monotonic(), int(found.group(1)), int(found.group(2))))

    def first_at(self) -> float | None:
        with self.lock:
            return self.seen[0][0] if self.seen else None

    def now(self) -> tuple[int, int, float] | None:
        """(last step, total steps, seconds a step) from the last printed steps; None before two were printed."""
        with self.lock:
            recent = self.seen[-SLOPE_LINES:]
        if len(recent) < 2 or recent[-1][1] <= recent[0][1]:
            return None
        (t0, s0, _), (t1, s1, total) = recent[0], recent[-1]
        return s1, total, (t1 - t0) / (s1 - s0)


@dataclass(frozen=True)
class GrowthCase:
    """The figures a decision to grow rests on."""

    step: int
    total_steps: int
    step_s: float  # a step on the ranks the job runs now
    ranks: int
    grown_ranks: int
    relaunch_s: float
    cost_source: str  # whence the relaunch cost: "measured", "stated: --relaunch-cost", "assumed"

    @property
    def grown_step_s(self) -> float:
        return self.step_s * self.ranks / self.grown_ranks

    @property
    def saved_s(self) -> float:
        return (self.total_steps - self.step) * (self.step_s - self.grown_step_s)

    @property
    def pays(self) -> bool:
        return self.total_steps - self.step > NEAR_END_STEPS and self.saved_s > self.relaunch_s

    def line(self, hosts: str) -> str:
        """The one line the supervisor prints for the decision."""
        left = self.total_steps - self.step
        if left <= NEAR_END_STEPS:
            verdict = f"{left} step(s) left, within {NEAR_END_STEPS} of the end: not growing."
        else:
            verdict = (f"{left} steps left save about {self.saved_s:.0f} s against a relaunch of {self.relaunch_s:.0f} "
                       f"s ({self.cost_source}): "
                       f"{'growing' if self.pays else 'not growing'}.")
        return (f"{hosts} ready: step {self.step_s:.2f} s on {self.ranks} ranks, about {self.grown_step_s:.2f} s on "
                f"{self.grown_ranks}; {verdict}")
