"""The phase clock of training and the bench: perf_counter, after the GPU has caught up."""

from __future__ import annotations

import time

import torch


class Clock:
    """perf_counter that first waits for queued GPU work, so phases are charged correctly."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()
