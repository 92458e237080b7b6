"""A model average's sum, sent by a thread of its own while the next local steps compute (--overlap).

The thread drives the sum's collectives on a process group of their own, opened at start
(collective): a group's collectives must come in the same order on every rank, and the main
thread's (the replica check, a test evaluation, a host's own average) come in between at
points the background sum does not know. Gloo and NCCL both allow two groups to be driven
from two threads; neither allows one group to be. The blocking collective releases the GIL,
so the main thread's forward and backward run meanwhile. On CUDA the thread queues its work
on a stream of its own, which first waits for what the main thread queued (the change it
sends), and the main thread waits for that stream before it reads the sum.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..timeline import now
from .base import sum_each_round


@dataclass
class Sent:
    """One background sum as it went: when its first message left and its last came back (this rank's clock)."""

    start: float
    end: float
    nbytes: float


class Background:
    """One sum at a time in a thread: start() hands it over and returns at once, wait() blocks until it is done (at
    once, when it already is) and re-raises what the thread raised."""

    def __init__(self, allreduce_sum: Callable[[torch.Tensor], None], device: torch.device):
        self.allreduce_sum = allreduce_sum  # on the background group(s)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.thread: threading.Thread | None = None
        self.sent: Sent | None = None
        self.error: BaseException | None = None

    def start(self, rounds: Iterator[torch.Tensor]) -> None:
        """Sum a compressor's rounds (compression/base.py) across ranks in the background."""
        if self.thread is not None:
            raise RuntimeError("a background sum is already in flight: wait() for it first")
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        self.sent, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(rounds,), name="model average", daemon=True)
        self.thread.start()

    def _run(self, rounds: Iterator[torch.Tensor]) -> None:
        nbytes = [0.0]

        def summed(message: torch.Tensor) -> None:
            nbytes[0] += message.numel() * message.element_size()
            self.allreduce_sum(message)

        try:
            with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
                start = now()
                sum_each_round(rounds, summed)
                if self.stream is not None:
                    self.stream.synchronize()  # NCCL returns once queued: the real end is when the stream is done
                self.sent = Sent(start, now(), nbytes[0])
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which raises it
            self.error = error

    @property
    def in_flight(self) -> bool:
        return self.thread is not None

    def wait(self) -> Sent:
        """Block until the sum is done; its timing. The main thread's stream then waits for the thread's."""
        if self.thread is None:
            raise RuntimeError("no background sum in flight")
        self.thread.join()
        self.thread = None
        if self.error is not None:
            raise self.error
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
        return self.sent

