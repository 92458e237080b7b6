"""The alpha-beta time of a sync method's step: its messages, priced by its collective family on a network.

A method says how its gradients travel (sync/messages.py: one message per tensor, one buffer,
or buckets), when they go (after backward, or during it), which family moves them
(families.py) and what they carry (its compressor's bytes per gradient byte, and how many
rounds of sums each message takes: PowerSGD 2). The prediction sends its messages one after
the other. For a method that overlaps backward, only what outlasts backward is exposed: a
bucket can leave once backward has produced its last gradient (when, the bench measures:
`Backward`; without a measurement, backward time is shared among the tensors by their bytes,
last layer first), so exposed = the last bucket's end - backward's end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..sync.messages import message_groups
from .families import family_of


@dataclass(frozen=True)
class Layout:
    """N ranks, R on each host (the last host may hold fewer), numbered host by host as mpirun fills a hostfile."""

    world: int
    ranks_per_host: int

    def __post_init__(self):
        if self.world < 1 or self.ranks_per_host < 1:
            raise ValueError(f"ranks ({self.world}) and ranks per host ({self.ranks_per_host}) must be at least 1")

    @property
    def hosts(self) -> int:
        return math.ceil(self.world / self.ranks_per_host)

    @property
    def local(self) -> int:
        """Ranks on rank 0's host."""
        return min(self.world, self.ranks_per_host)

    @classmethod
    def of_hosts(cls, hosts: Sequence[str]) -> Layout:
        """The layout of a running job, from the host of each rank."""
        return cls(len(hosts), max(hosts.count(h) for h in set(hosts)))


@dataclass(frozen=True)
class Backward:
    """When backward hands each gradient over: its length as a share of forward + backward, for each tensor
    (registration order) the share of backward elapsed when its gradient is ready, and the order they came in.

    The bench measures all three on its no-sync replica (commands/bench.py, BackwardClock); without a measurement
    backward is 2/3 of compute and produces bytes at a constant rate, last layer first.
    """

    share: float = 2 / 3  # backward does about twice forward's work
    ready: tuple[float, ...] | None = None
    order: tuple[int, ...] | None = None  # tensor indices in the order their gradients were ready (autograd's)

    def ready_times(self, tensor_bytes: Sequence[float], backward_s: float) -> list[float]:
        """Seconds into backward at which each tensor's gradient is ready (registration order)."""
        if self.ready is not None and len(self.ready) == len(tensor_bytes):
            return [backward_s * share for share in self.ready]
        total, done, times = sum(tensor_bytes) or 1.0, 0.0, [0.0] * len(tensor_bytes)
        for i in reversed(range(len(tensor_bytes))):  # backward runs from the last layer to the first
            done += tensor_bytes[i]
            times[i] = backward_s * done / total
        return times

    def as_dict(self) -> dict:
        return {"share": self.share, "ready": list(self.ready) if self.ready is not None else None,
                "order": list(self.order) if self.order is not None else None}

    @classmethod
    def from_dict(cls, data: dict | None) -> Backward:
        if not data:
            return cls()
        return cls(float(data["share"]), tuple(data["ready"]) if data.get("ready") is not None else None,
                   tuple(data["order"]) if data.get("order") is not None else None)


ASSUMED_BACKWARD = Backward()


@dataclass(frozen=True)
class Prediction:
    """A method's predicted communication per step, and what of it the step pays (exposed)."""

    method: str
    collective: str
    messages: int
    wire_bytes: float
    comm_s: float  # all its messages, one after the other
    overlapped: bool
    exposed_s: float | None = None  # overlapped methods, given a backward time

    @property
    def sync_s(self) -> float:
        """What the step pays for communication: exposed for an overlapped method (comm when backward is unknown)."""
        return self.exposed_s if self.exposed_s is not None else self.comm_s


def exposed_time(message_times: Sequence[float], ready_s: Sequence[float], backward_s: float) -> float:
    """Messages sent one after the other, each once backward has produced its last gradient (`ready_s`, seconds into
    backward); what runs past the end of backward."""
    finish = 0.0
    for seconds, ready in zip(message_times, ready_s):
        finish = max(finish, ready) + seconds
    return max(0.0, finish - backward_s)


def predict(method, tensor_bytes: Sequence[float], layout: Layout, network, label: str = "",
            ratio: float | None = None, backward_s: float | None = None,
            backward: Backward = ASSUMED_BACKWARD) -> Prediction | None:
    """A configured sync method's (`method`, a SyncMethod) predicted sync per step on `network` (links.Network);
    None when it declares no collective family. `ratio` is the bytes on the wire per gradient byte (its
    compressor's, measured on the model's parameters by the caller; default: from its wire dtype); each message
    takes the compressor's rounds of sums, each paying the latency again. `backward` says when each gradient is
    ready and in which order, for an overlapped method's buckets and exposed time (given `backward_s`)."""
    family = family_of(method)
    if family is None:
        return None
    if ratio is None:
        ratio = method.wire_dtype.itemsize / 4 if method.wire_dtype is not None else 1.0
    rounds = method.compressor.rounds_per_step
    groups = message_groups(tensor_bytes, method.messages, method.bucket_caps(), backward.order)
    sizes = [sum(tensor_bytes[i] for i in group) * ratio for group in groups]
    latency = family.time(0.0, layout, network)
    times = [family.time(size, layout, network) + (rounds - 1) * latency for size in sizes]
    overlapped = method.overlapped()
    exposed = None
    if overlapped and backward_s is not None:
        ready = backward.ready_times(tensor_bytes, backward_s)
        exposed = exposed_time(times, [max(ready[i] for i in group) for group in groups], backward_s)
    return Prediction(label or type(method).__name__, family.name, len(sizes), sum(sizes), sum(times), overlapped,
                      exposed)


def tensor_sizes(model) -> list[int]:
    """Bytes of each trainable parameter's gradient, in registration order."""
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
