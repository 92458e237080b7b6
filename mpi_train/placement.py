"""Where a rank computes and how its phases are timed: set up the same way for training and for the bench."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from .cluster import Cluster, configure_threads, resolve_backend


@dataclass(frozen=True)
class Placement:
    """This rank's process-group backend, device and CPU threads."""

    backend: str
    device: torch.device
    threads: int


def place(cluster: Cluster, backend: str, threads: Optional[int]) -> Placement:
    """Threads first (cores shared by the host's ranks), then backend and device; collective (ranks agree on NCCL)."""
    threads = configure_threads(cluster.info, threads)
    backend, device_name = resolve_backend(cluster, backend)
    return Placement(backend, torch.device(device_name), threads)  # under NCCL, resolve_backend made the device current


class Clock:
    """perf_counter that first waits for queued GPU work, so phases are charged correctly."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()
