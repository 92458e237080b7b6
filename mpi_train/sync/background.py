"""A model average's sum, sent while the next local steps compute (--overlap).

On CPUs (Gloo) a thread of its own drives the sum's collectives, on a process group of their
own opened at start (collective): a group's collectives must come in the same order on every
rank, and the main thread's (the replica check, a test evaluation, a host's own average) come
in between at points the background sum does not know. Gloo serves two groups from two
threads; the blocking collective releases the GIL, so forward and backward run meanwhile.

On CUDA (NCCL) no thread is needed, and none is safe: a collective returns to the CPU once
queued, and NCCL's documentation warns that two communicators used at once from two threads
may deadlock unless every rank submits their operations in the same order. So the sum is
queued from the main thread, on the job's own groups (one communicator keeps its operations
in order on every rank), on a side stream that first waits for the change it sends; the
main stream waits for the side stream only when it merges the sum.
"""

from __future__ import annotations

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
    """One sum at a time: start() hands it over (to a thread on CPUs, to a side stream on CUDA) and returns at once,
    wait() blocks until it is done (at once, when it already is) and re-raises what the thread raised."""

    def __init__(self, allreduce_sum: Callable[[torch.Tensor], None], device: torch.device):
        self.allreduce_sum = allreduce_sum  # on the background's groups (Gloo) or the job's (NCCL)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.thread: threading.Thread | None = None  # Gloo's
        self.queued: tuple | None = None  # CUDA's: when it was queued, its start and end events, its bytes
        self.sent: Sent | None = None
        self.error: BaseException | None = None

    def start(self, rounds: Iterator[torch.Tensor]) -> None:
        """Sum a compressor's rounds (compression/base.py) across ranks in the background."""
        if self.thread is not None or self.queued is not None:
            raise RuntimeError("a background sum is already in flight: wait() for it first")
        self.sent, self.error = None, None
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
            begun, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(self.stream):
                begun.record()
                launched = now()
                nbytes = self._sum(rounds)
                done.record()
            self.queued = (launched, begun, done, nbytes)
            return
        self.thread = threading.Thread(target=self._run, args=(rounds,), name="model average", daemon=True)
        self.thread.start()

    def _sum(self, rounds: Iterator[torch.Tensor]) -> float:
        nbytes = [0.0]

        def summed(message: torch.Tensor) -> None:
            nbytes[0] += message.numel() * message.element_size()
            self.allreduce_sum(message)

        sum_each_round(rounds, summed)
        return nbytes[0]

    def _run(self, rounds: Iterator[torch.Tensor]) -> None:
        try:
            start = now()
            nbytes = self._sum(rounds)
            self.sent = Sent(start, now(), nbytes)
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which raises it
            self.error = error

    def wait(self) -> Sent:
        """Block until the sum is done; its timing (on CUDA: from its queuing, as long as the stream took)."""
        if self.queued is not None:
            (launched, begun, done, nbytes), self.queued = self.queued, None
            done.synchronize()
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
            return Sent(launched, launched + begun.elapsed_time(done) / 1000, nbytes)
        if self.thread is None:
            raise RuntimeError("no background sum in flight")
        self.thread.join()
        self.thread = None
        if self.error is not None:
            raise self.error
        return self.sent
