"""The alpha-beta time of a sync method's step: its messages, priced by its collective family on a network.

A method says how its gradients travel (sync/messages.py: one message per tensor, one buffer,
or buckets), when they go (after backward, or during it), which family moves them
(families.py) and what they carry (its compressor's bytes per gradient byte, and how many
rounds of sums each message takes: PowerSGD 2). A method that averages models every H steps
(localsgd, diloco) pays 1/H of one average per step. The prediction sends its messages one after
the other. For a method that overlaps backward, only what outlasts backward is exposed: a
bucket can leave once backward has produced its last gradient (when, the bench measures:
`Backward`; without a measurement, backward time is shared among the tensors by their bytes,
last layer first), so exposed = the last bucket's end - backward's end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..sync.fsdp import units
from ..sync.messages import message_groups
from ..sync.traits import RING_ALLREDUCE, Cadence
from .families import AFTER_STEP, FAMILIES, IN_FORWARD, NEXT_FORWARD, WITH_MESSAGE, Part, family_of


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

    The bench measures all three on its no-sync replica (benchmark/clocks.py, BackwardClock); without a measurement
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
    parts: dict = field(default_factory=dict)  # seconds per step of each of its collectives (families.Part), by name
    background_s: float | None = None  # per step, the averages sent in the background (--overlap)
    in_forward_s: float = 0.0  # of exposed, the gathers forward waits for (fsdp's, zero's): a job's compute holds it
    plan: tuple = ()  # its messages as message_plan laid them out (PlannedMessage)

    @property
    def sync_s(self) -> float:
        """What the step pays for communication: exposed for an overlapped method (comm when backward is unknown)."""
        return self.exposed_s if self.exposed_s is not None else self.comm_s


@dataclass(frozen=True)
class PlannedMessage:
    """One message of a step as the model sees it: which tensors, its bytes on the wire, when its last gradient is
    ready and when it starts and ends (seconds from the start of backward), and its tensors' own bytes, which a
    part that carries the parameters uncompressed moves (zero's all-gather; fsdp's, in the dtype its policy gathers
    them in: gathered_share; 0 for a later round's message), and
    whether it is such a later round, sent after backward (`later`)."""

    tensors: tuple[int, ...]
    nbytes: float
    ready_s: float
    start_s: float
    end_s: float
    plain_bytes: float = 0.0
    later: bool = False

    def carried_by(self, part: Part) -> float:
        """The bytes `part` moves for this message: the wire's, or the plain tensors' for an uncompressed part."""
        return self.nbytes if part.compressed else self.plain_bytes


def wire_bytes(method, params: Sequence) -> float:
    """S of the cost model: bytes each of a configured method's syncs carries for these parameters, as its
    compressor sends them (a model-averaging method's fragments: each average carries 1/F of the model)."""
    cadence = method.traits.cadence
    return method.compressor.wire_bytes([p for p in params if p.requires_grad]) / (cadence.fragments if cadence else 1)


def wire_ratio(method, params: Sequence) -> float:
    """Bytes on the wire per gradient byte for these parameters (fp16: 0.5; PowerSGD: its factors)."""
    gradient_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    return wire_bytes(method, params) / gradient_bytes if gradient_bytes else 1.0


def gathered_share(method) -> float:
    """Bytes a method's all-gathers move per byte of the parameters they carry: 1, or what its gathered dtype takes
    of float32's 4 bytes (fsdp under bf16-mixed or 16-mixed gathers bfloat16 or float16 copies: 0.5)."""
    dtype = method.traits.gathered_dtype
    return dtype.itemsize / 4 if dtype is not None else 1.0


def later_share(method, params: Sequence) -> float:
    """The share of a method's wire bytes its compressor sums after the first round (PowerSGD's Qs; else 0)."""
    return method.compressor.later_share([p for p in params if p.requires_grad])


def _wire(method, ratio: float | None) -> float:
    """Bytes on the wire per gradient byte: `ratio` as measured (wire_ratio), else from the wire dtype (and a
    model-averaging method's fragments: each average carries 1/F of the model)."""
    if ratio is not None:
        return ratio
    traits = method.traits
    share = 1 / traits.cadence.fragments if traits.cadence else 1.0
    return share * (traits.wire_dtype.itemsize / 4 if traits.wire_dtype is not None else 1.0)


def message_plan(method, tensor_bytes: Sequence[float], layout: Layout, network, ratio: float | None = None,
                 backward_s: float = 0.0, backward: Backward = ASSUMED_BACKWARD,
                 units: Sequence[int] | None = None, later: float = 0.0) -> list[PlannedMessage]:
    """Each message of a step, one after the other: an overlapped method's leaves once backward has produced its
    last gradient, the others' once backward (`backward_s` long) is over; each takes the time of its family's parts
    that go with the message (families.WITH_MESSAGE: all of a one-collective family) for its bytes, plus the latency
    of every further round of sums (PowerSGD: 2 rounds). Where a method sends its later rounds only after backward
    (later_rounds_after_backward: `bucketed`), each message's `later` share of bytes (later_share: PowerSGD's
    Qs) is a message of its own, all of them after backward and after every first round, in bucket order. A method
    that sends per unit sends one message per layer block of `units` (tensor_units). [] for a method without
    family."""
    family = family_of(method)
    if family is None:
        return []
    traits, ratio, rounds = method.traits, _wire(method, ratio), method.compressor.rounds_per_step
    groups = message_groups(tensor_bytes, traits.messages, traits.bucket_caps, backward.order, units)
    ready = backward.ready_times(tensor_bytes, backward_s) if traits.overlapped() else [backward_s] * len(tensor_bytes)
    with_message = [part for part in family.collectives() if part.when == WITH_MESSAGE]

    def sent(size: float) -> float:
        return sum(part.time(size, layout, network) for part in with_message)

    latency, gathered = sent(0.0), gathered_share(method)
    deferred = rounds > 1 and traits.overlapped() and traits.later_rounds_after_backward
    first_share = 1.0 - later if deferred else 1.0
    plan, finish = [], 0.0
    for group in groups:
        size = sum(tensor_bytes[i] for i in group) * ratio
        seconds = sent(size * first_share) + (0 if deferred else rounds - 1) * latency
        at = max(ready[i] for i in group)
        start = max(finish, at)
        finish = start + seconds
        plan.append(PlannedMessage(tensors=tuple(group), nbytes=size * first_share, ready_s=at, start_s=start,
                                   end_s=finish, plain_bytes=sum(tensor_bytes[i] for i in group) * gathered))
    if deferred:  # the later rounds: sync() sends them once backward is over and each first round's sum is in
        for group in groups:
            size = sum(tensor_bytes[i] for i in group) * ratio * later
            start = max(finish, backward_s)
            finish = start + sent(size) + (rounds - 2) * latency
            plan.append(PlannedMessage(tensors=tuple(group), nbytes=size, ready_s=backward_s, start_s=start,
                                       end_s=finish, later=True))
    return plan


def predict(method, tensor_bytes: Sequence[float], layout: Layout, network, label: str = "",
            ratio: float | None = None, backward_s: float | None = None,
            backward: Backward = ASSUMED_BACKWARD, compute_s: float | None = None,
            units: Sequence[int] | None = None, later: float = 0.0,
            step_ends_at_barrier: bool = False) -> Prediction | None:
    """A configured sync method's (`method`, a SyncMethod) predicted sync per step on `network` (links.Network);
    None when it declares no collective family. `ratio` is the bytes on the wire per gradient byte (its
    compressor's, measured on the model's parameters by the caller; default: from its wire dtype). `backward` says
    when each gradient is ready and in which order, for an overlapped method's buckets and exposed time (given
    `backward_s`): message_plan's messages, and what of them runs past the end of backward. A model average sent
    in the background (--overlap) hides under the local steps until the next turn: given a step's compute
    (`compute_s`), it is free while its transfer fits in them and costs the rest when it does not. `units`: each
    tensor's layer block (tensor_units), for a method that sends one message per block (fsdp): each pays its
    collectives' latency. `later`: the share of the wire bytes summed after the first round (later_share),
    for a method that sends those rounds after backward. `step_ends_at_barrier`: a barrier ends each step (the
    bench's), so what a method starts after its step for the next forward (zero's all-gathers) is waited for
    there, whole, not under that forward."""
    family = family_of(method)
    if family is None:
        return None
    plan = message_plan(method, tensor_bytes, layout, network, ratio, backward_s or 0.0, backward, units, later)
    overlapped, cadence = method.traits.overlapped(), method.traits.cadence
    parts = {part.name: sum(part.time(m.carried_by(part), layout, network) for m in plan)
             for part in family.collectives()}
    waited_after = (AFTER_STEP, NEXT_FORWARD) if step_ends_at_barrier else (AFTER_STEP,)
    after_step = sum(parts[part.name] for part in family.collectives() if part.when in waited_after)
    exposed, in_forward = None, 0.0
    if overlapped and backward_s is not None:
        exposed = (max(0.0, plan[-1].end_s - backward_s) if plan else 0.0) + after_step
        forward_s = backward_s / backward.share - backward_s if backward.share else 0.0
        waited_in_forward = (IN_FORWARD,) if step_ends_at_barrier else (IN_FORWARD, NEXT_FORWARD)
        in_forward = forward_exposed(family, plan, layout, network, forward_s, waited_in_forward)
        exposed += in_forward
    comm_s, wire_bytes = sum(m.end_s - m.start_s for m in plan) + sum(
        parts[part.name] for part in family.collectives() if part.when != WITH_MESSAGE), sum(m.nbytes for m in plan)
    if cadence:  # a model-averaging method: per step, its averages' share
        across_s = comm_s / cadence.every
        comm_s, wire_bytes = averaging_per_step(cadence, comm_s, wire_bytes, sum(tensor_bytes), layout, network)
    if len(parts) == 1:  # one collective: its time is the whole, further rounds of sums and averaging included
        parts = {name: comm_s for name in parts}
    background = None
    if cadence and cadence.overlap:
        overlapped, background = True, across_s
        exposed = None if compute_s is None else (comm_s - across_s) + overlapped_exposed(across_s, compute_s)
    return Prediction(method=label or type(method).__name__, collective=family.name, messages=len(plan),
                      wire_bytes=wire_bytes, comm_s=comm_s, overlapped=overlapped, exposed_s=exposed, parts=parts,
                      background_s=background, in_forward_s=in_forward, plan=tuple(plan))


def with_codec(plan: Sequence[PlannedMessage], backward_s: float, codec: Sequence[float]) -> float | None:
    """What of an overlapped method's messages outlasts backward, with its compressor's work after backward placed
    where sync() runs it instead of added after the wire: bucket by bucket it waits for a round's sum, runs the
    compressor (`codec`: each interval's seconds, as the bench timed them), then sends the bucket's next round, so
    one bucket's work runs while another's sum is on the wire (PowerSGD's Qs of the second bucket are computed
    while the first bucket's travel). `plan` is message_plan's: each bucket's first round, then (PowerSGD on
    `bucketed`) each bucket's later round, sent in turn on one wire; `codec` holds one interval per message, in
    sync()'s order (every bucket's first, then every bucket's second). None when the intervals do not fit that
    shape (a bucket launched after backward adds one): the caller then adds the codec after the wire."""
    first = [message for message in plan if not message.later]
    later = [message for message in plan if message.later]
    if not first or len(codec) != len(plan) or len(later) not in (0, len(first)):
        return None
    buckets, ends = len(first), [message.end_s for message in first]
    cpu, wire = backward_s, max([backward_s, *ends])
    for b in range(buckets):  # each bucket's first sum in: its compressor's work, then its next round leaves
        cpu = max(cpu, ends[b]) + codec[b]
        if later:
            wire = max(cpu, wire) + later[b].end_s - later[b].start_s
            ends[b] = wire
    for b in range(buckets if later else 0):  # each later sum in: the work that ends the bucket's average
        cpu = max(cpu, ends[b]) + codec[buckets + b]
    return max(0.0, cpu - backward_s)


def forward_exposed(family, plan: list[PlannedMessage], layout: Layout, network, forward_s: float,
                    whens: Sequence[str] = (IN_FORWARD,)) -> float:
    """What of a family's gathers waited for in forward (FSDP's per unit, zero's per bucket: its parts whose `when`
    is in `whens`) the forward compute does not hide: each unit's gather can run while the units before compute
    (FSDP prefetches the next; zero's are all under way, first layers first), so the first unit's gather is always
    paid, and all of them beyond the forward's length; the model takes the larger."""
    forward = [part for part in family.collectives() if part.when in whens]
    if not forward or not plan:
        return 0.0

    def gather(message: PlannedMessage) -> float:
        return sum(part.time(message.carried_by(part), layout, network) for part in forward)

    first = next((m for m in plan if 0 in m.tensors), plan[-1])  # the first layer's: forward starts with it
    return max(gather(first), sum(gather(m) for m in plan) - forward_s)


def averaging_every(method) -> int:
    """Steps between two averages across hosts of a configured model-averaging method: its period, or period/F
    with F fragments (each average then carries 1/F of the model)."""
    return method.traits.cadence.every


def overlapped_exposed(average_s: float, compute_s: float) -> float:
    """What a step pays of an average sent in the background, per step: the transfer hides under the local steps
    until the next average, exposed = max(0, transfer - their compute), both per step here."""
    return max(0.0, average_s - compute_s)


def averaging_per_step(cadence: Cadence, comm_s: float, wire_bytes: float, model_bytes: float, layout: Layout,
                       network) -> tuple[float, float]:
    """Seconds and bytes per step of a method that averages models (sync/averaging.py) every `period` steps, from
    one average's: 1/H of it (1/(H/F) with F fragments, each a 1/F share of the model), plus, with two levels
    (`host_period` h), the (H-1)//h averages inside each host per H steps, sent whole around a ring of the host's
    ranks on the intra-host link."""
    period, host_period = cadence.period, cadence.host_period
    comm_s, wire_bytes = comm_s / cadence.every, wire_bytes / cadence.every
    if host_period and layout.hosts > 1 and layout.local > 1:
        inside = (period - 1) // host_period / period
        host = Layout(layout.local, layout.local)
        comm_s += inside * FAMILIES[RING_ALLREDUCE].time(model_bytes, host, network)
        wire_bytes += inside * model_bytes
    return comm_s, wire_bytes


def tensor_sizes(model) -> list[int]:
    """Bytes of each trainable parameter's gradient, in registration order."""
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


def tensor_units(model) -> list[int]:
    """Each trainable parameter's layer block, in registration order: the units fsdp shards, gathers and
    reduce-scatters one at a time (sync/fsdp.py); what no unit holds is the root's, one block after them."""
    blocks = units(model)
    block_of = {id(param): index for index, block in enumerate(blocks) for param in block.parameters()}
    return [block_of.get(id(p), len(blocks)) for p in model.parameters() if p.requires_grad]
