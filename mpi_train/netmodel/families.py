"""Collective families: how a sync method moves S bytes of gradients among N ranks, in bytes and in seconds.

A sync method names its family in its traits' `family` (sync/traits.py); everything else (bytes per
rank, the floor a link allows, the alpha-beta time) is looked up here by that name. A family's
name is not a method's: `ring_allreduce` is what `ring`, `flat`, `ddp` and others run.
For S bytes on N ranks:

- `ring_allreduce` (bandwidth-optimal allreduce: ring, or reduce-scatter + all-gather): every rank sends
  and receives 2(N-1)/N·S, all links busy at once, so the floor is 2(N-1)/N·S/B. A message
  takes 2(N-1) steps of S/N bytes: 2(N-1)·alpha + 2(N-1)/N·S·beta; with more than one host every
  step waits for the edge that crosses hosts, so alpha and beta are the inter-host link's. With a
  calibration's fit of the backend's allreduce (links.CollectiveCost, ALLREDUCE) each step pays
  its measured latency and the bytes its factor times the link's: what a short message costs on
  Gloo (about 3 ms a call between the test hosts) where a ping-pong's fit often finds no alpha.
- `root` (gather to rank 0, scatter back): rank 0 receives (N-1)·S and sends (N-1)·S, the others
  send S and receive S; rank 0's one link carries everything, so the floor is 2(N-1)·S/B. In
  time: 2(N-1) messages' latency, and rank 0's host link carries (N-R)·S in and then (N-R)·S
  out while its host's other R-1 ranks use the intra-host link:
  2(N-1)·alpha + 2·((N-R)·S·beta_inter + (R-1)·S·beta_intra).
- `two_level` (reduce to each host's leader, allreduce among the H leaders, broadcast in the
  host): only the leaders cross hosts, each sending and receiving 2(H-1)/H·S there, so the
  floor is 2(H-1)/H·S/B; the other ranks move S each way within their host (Gloo's TCP over
  loopback, not shared memory), which the floor leaves out and the time counts on the measured
  intra-host link: a binomial-tree reduce and broadcast, each ceil(log2 R) messages of S, around
  a ring of the H leaders: 2·ceil(log2 R)·(alpha_intra + S·beta_intra) + 2(H-1)·alpha +
  2(H-1)/H·S·beta. On one host, or with one rank per host, it is `ring_allreduce`.

Three families shard what a rank keeps (the traits' `shards`) and move S in more than one collective,
each a part of its own (`parts`, priced apart: a report shows the reduce-scatter apart from the
all-gather). A reduce-scatter or an all-gather of S on a ring moves (N-1)/N·S per rank in N-1 steps:
(N-1)·alpha + (N-1)/N·S·beta, half a ring allreduce. That is what a bandwidth-optimal backend
(NCCL) takes; Gloo over TCP takes longer (docs/results.md, "What the sharded methods cost a step"). When the
network carries a calibration's measured cost of the collective (links.CollectiveCost, from the
bench's fits of reduce_scatter_single and all_gather_single), each of the N-1 steps pays
the measured latency alpha_c and the bytes f_c times the link's: (N-1)·alpha_c + f_c·(N-1)/N·S·beta.
Without one (nominal links, a job's own ping-pong) they are priced at a ring's bytes.

- `reduce_scatter` (ZeRO-2, `zero`): each bucket's gradients reduce-scattered as backward fills
  it, each rank steps its shard, then the updated parameters all-gathered: 2(N-1)/N·S per rank
  as a ring allreduce moves, floor 2(N-1)/N·S/B, time 2(N-1)·alpha + 2(N-1)/N·S·beta, in two
  parts: the reduce-scatter goes with the message (during backward); the all-gathers start after
  the optimizer step, first layers first, and the next forward waits for each bucket's as it
  reaches the bucket's first layer, so they hide behind forward as FSDP's do (the first bucket's
  is always paid). They carry the parameters in their own type, whatever the reduce-scatter's
  compression. Where a barrier ends each step (the bench's), the step waits for them whole.
- `layerwise_gather` (ZeRO-3, FSDP's `fsdp`): per unit, its parameters all-gathered before its
  forward, again before its backward (they are freed after forward), and its gradients
  reduce-scattered in backward: 3(N-1)/N·S per rank, floor 3(N-1)/N·S/B, time
  3(N-1)·alpha + 3(N-1)/N·S·beta in three parts: the forward's gathers, the backward's gathers
  and the reduce-scatters (the last two go with the message, during backward). Under a mixed
  precision the gathers carry half-size copies of the parameters (traffic_size): 2(N-1)/N·S.
- `ring_then_broadcast` (ZeRO-1, `zero_torch`: ZeroRedundancyOptimizer under DDP): DDP's ring
  allreduce during backward, then after the step each shard's owner broadcasts its updated
  parameters: (N-1)/N·S more per rank (3(N-1)/N·S in all), floor 3(N-1)/N·S/B. Gloo broadcasts
  down a binomial tree, so the N broadcasts of S/N cost N·ceil(log2 N)·alpha +
  ceil(log2 N)·S·beta, after the step.

A straggler host (stragglers.py: one link far slower than the others') is the network's `slow`
link: a ring, and the host leaders' ring of `two_level`, wait for it at every step; through
rank 0 (`root`) its link carries its own ranks' share (R·S each way), unless it is rank 0's
host, whose link carries everything.

`layout` is a prediction.Layout (N ranks, R per host), `network` a links.Network; `hosts` each
rank's host, which matters only to `two_level`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..sync.traits import LAYERWISE_GATHER, RING_ALLREDUCE, RING_THEN_BROADCAST, ROOT, TWO_LEVEL
from ..sync.traits import REDUCE_SCATTER as REDUCE_SCATTER_FAMILY
from .links import ALL_GATHER, ALLREDUCE, REDUCE_SCATTER, RING_REDUCE_SCATTER

# when a part of a family's message goes: prediction.py prices each where it falls in the step
WITH_MESSAGE = "with the message"  # when the method sends it (after backward, or during it as buckets fill)
IN_FORWARD = "in forward"  # before each unit's forward (FSDP's gathers)
NEXT_FORWARD = "before the next forward"  # started after the step, waited for in the next forward (ZeRO's gathers)
AFTER_STEP = "after the step"  # once the optimizer has stepped, waited for there (ZeRO-1's broadcasts)


@dataclass(frozen=True)
class Part:
    """One collective of a family's message: its name as a report shows it, when it goes, its alpha-beta time."""

    name: str
    when: str  # WITH_MESSAGE, IN_FORWARD, NEXT_FORWARD or AFTER_STEP
    time: Callable[..., float]  # (S, layout, network) -> seconds, for a message of S bytes
    measured: tuple[str, ...] = ()  # the collectives a calibration measures that price it, the first found wins
    # it carries the compressor's bytes; False: the parameters, in their own type or the one they are gathered in
    compressed: bool = True
    share: float = 1.0  # bytes each rank sends per byte it carries, in (N-1)/N: 1 for a half ring, 2 for an allreduce


@dataclass(frozen=True)
class Family:
    """One family of algorithms: bytes each rank moves, the floor a link of B bytes/s allows, the alpha-beta time."""

    name: str
    describe: str
    traffic: Callable[..., tuple[float, float]]  # (S, N, rank, hosts=None) -> (bytes sent, bytes received)
    floor: Callable[..., float]  # (S, N, B bytes/s, hosts=None) -> seconds
    time: Callable[..., float]  # (S, layout, network) -> seconds for one message of S bytes, all its parts
    parts: tuple[Part, ...] = ()  # its collectives apart (default: one, named `one`, with the message)
    one: str = "allreduce"  # what a report calls its one collective

    def collectives(self) -> tuple[Part, ...]:
        return self.parts or (Part(self.one, WITH_MESSAGE, self.time),)


def _levels(world: int, hosts: Sequence[str] | None) -> list[str] | None:
    """The distinct hosts in rank order, when a two-level allreduce has two levels to use; else None."""
    distinct = list(dict.fromkeys(hosts)) if hosts else []
    return distinct if 1 < len(distinct) < world else None


# --- ring_allreduce ---------------------------------------------------------------------------

def _ring_traffic(size: float, world: int, rank: int, hosts: Sequence[str] | None = None) -> tuple[float, float]:
    moved = 2 * (world - 1) / world * size
    return moved, moved


def _ring_floor(size: float, world: int, bandwidth: float, hosts: Sequence[str] | None = None) -> float:
    return 2 * (world - 1) / world * size / bandwidth


def _ring_time(size: float, layout, network) -> float:
    n = layout.world
    if n == 1:
        return 0.0
    link = network.slowest if layout.hosts > 1 else network.intra
    measured = network.cost(ALLREDUCE)
    if measured is not None:  # the backend's allreduce as a calibration timed it: its latency per call above all
        return measured.time(size, n, link)
    return 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * size * link.beta


# --- root -------------------------------------------------------------------------------------

def _root_traffic(size: float, world: int, rank: int, hosts: Sequence[str] | None = None) -> tuple[float, float]:
    if world == 1:
        return 0.0, 0.0
    moved = (world - 1) * size if rank == 0 else size
    return moved, moved


def _root_floor(size: float, world: int, bandwidth: float, hosts: Sequence[str] | None = None) -> float:
    return 2 * (world - 1) * size / bandwidth


def _root_time(size: float, layout, network) -> float:
    n, local = layout.world, layout.local
    if n == 1:
        return 0.0
    alpha = network.slowest.alpha if layout.hosts > 1 else network.intra.alpha
    across = (n - local) * size * network.inter.beta  # rank 0's host link, each way
    if network.slow and layout.hosts > 1:  # a straggler: its own link carries its ranks' share, or all of it
        across = ((n - local) * size * network.slow.beta if network.slow_is_root
                  else max(across, layout.ranks_per_host * size * network.slow.beta))
    return 2 * (n - 1) * alpha + 2 * (across + (local - 1) * size * network.intra.beta)


# --- two_level --------------------------------------------------------------------------------

def _two_level_traffic(size: float, world: int, rank: int,
                          hosts: Sequence[str] | None = None) -> tuple[float, float]:
    levels = _levels(world, hosts)
    if levels is None:
        return _ring_traffic(size, world, rank)
    leader = hosts.index(hosts[rank]) == rank  # the host's lowest rank
    moved = 2 * (len(levels) - 1) / len(levels) * size if leader else 0.0
    return moved, moved


def _two_level_floor(size: float, world: int, bandwidth: float, hosts: Sequence[str] | None = None) -> float:
    levels = _levels(world, hosts)
    if levels is None:
        return _ring_floor(size, world, bandwidth)
    return 2 * (len(levels) - 1) / len(levels) * size / bandwidth


def _two_level_time(size: float, layout, network) -> float:
    hosts, local = layout.hosts, layout.local
    if hosts == 1 or local == 1:
        return _ring_time(size, layout, network)
    levels = math.ceil(math.log2(local))
    inside = 2 * levels * (network.intra.alpha + size * network.intra.beta)  # reduce to the leader, broadcast back
    leaders = network.slowest  # the leaders' ring waits for the slowest host's link
    return inside + 2 * (hosts - 1) * leaders.alpha + 2 * (hosts - 1) / hosts * size * leaders.beta


# --- the sharded families: reduce-scatters and all-gathers --------------------------------------

def _half_ring(*collectives: str) -> Callable[..., float]:
    """One reduce-scatter, or one all-gather, of S bytes: on a ring, (N-1)·alpha + (N-1)/N·S·beta; as the backend ran
    it when the network carries a measured cost of the first of `collectives` it has (links.CollectiveCost)."""
    def time(size: float, layout, network) -> float:
        n = layout.world
        if n == 1:
            return 0.0
        link = network.slowest if layout.hosts > 1 else network.intra
        measured = network.cost(*collectives)
        if measured is not None:
            return measured.time(size, n, link)
        return (n - 1) * link.alpha + (n - 1) / n * size * link.beta

    return time


def _owners_broadcast_time(size: float, layout, network) -> float:
    """Each of N owners broadcasts its S/N down a binomial tree (Gloo's): N·ceil(log2 N)·alpha + ceil(log2 N)·S·beta."""
    n = layout.world
    if n == 1:
        return 0.0
    link = network.slowest if layout.hosts > 1 else network.intra
    levels = math.ceil(math.log2(n))
    return n * levels * link.alpha + levels * size * link.beta


def _times(share: float) -> tuple[Callable[..., tuple[float, float]], Callable[..., float]]:
    """Traffic and floor of a family that moves `share` x (N-1)/N·S per rank each way, every link busy at once."""
    def traffic(size: float, world: int, rank: int, hosts: Sequence[str] | None = None) -> tuple[float, float]:
        moved = share * (world - 1) / world * size
        return moved, moved

    def floor(size: float, world: int, bandwidth: float, hosts: Sequence[str] | None = None) -> float:
        return share * (world - 1) / world * size / bandwidth

    return traffic, floor


def _sum_of(parts: tuple[Part, ...]) -> Callable[..., float]:
    return lambda size, layout, network: sum(part.time(size, layout, network) for part in parts)


# zero's reduce-scatter: its own ring where the calibration timed one (Gloo, where zero runs it), else the backend's
ZERO_REDUCE_SCATTER = (RING_REDUCE_SCATTER, REDUCE_SCATTER)
REDUCE_SCATTER_PARTS = (Part("reduce-scatter", WITH_MESSAGE, _half_ring(*ZERO_REDUCE_SCATTER), ZERO_REDUCE_SCATTER),
                        Part("all-gather", NEXT_FORWARD, _half_ring(ALL_GATHER), (ALL_GATHER,), compressed=False))
LAYERWISE_GATHER_PARTS = (Part("all-gather (forward)", IN_FORWARD, _half_ring(ALL_GATHER), (ALL_GATHER,),
                               compressed=False),
                          Part("all-gather (backward)", WITH_MESSAGE, _half_ring(ALL_GATHER), (ALL_GATHER,),
                               compressed=False),
                          Part("reduce-scatter", WITH_MESSAGE, _half_ring(REDUCE_SCATTER), (REDUCE_SCATTER,)))
RING_THEN_BROADCAST_PARTS = (Part("allreduce", WITH_MESSAGE, _ring_time, share=2),
                             Part("broadcast", AFTER_STEP, _owners_broadcast_time))


FAMILIES: dict[str, Family] = {
    RING_ALLREDUCE: Family(RING_ALLREDUCE, "2(N-1)/N·S per rank, floor 2(N-1)/N·S/B", _ring_traffic, _ring_floor,
                           _ring_time),
    ROOT: Family(ROOT, "rank 0 moves 2(N-1)·S, others 2·S, floor 2(N-1)·S/B", _root_traffic, _root_floor,
                 _root_time, one="gather and scatter"),
    TWO_LEVEL: Family(TWO_LEVEL, "host leaders move 2(H-1)/H·S between hosts, the others S each way within their "
                      "host; floor 2(H-1)/H·S/B (one host: ring_allreduce)", _two_level_traffic, _two_level_floor,
                      _two_level_time, one="two-level allreduce"),
    REDUCE_SCATTER_FAMILY: Family(REDUCE_SCATTER_FAMILY, "reduce-scatter then all-gather: 2(N-1)/N·S per rank, "
                                  "floor 2(N-1)/N·S/B", *_times(2), _sum_of(REDUCE_SCATTER_PARTS),
                                  REDUCE_SCATTER_PARTS),
    LAYERWISE_GATHER: Family(LAYERWISE_GATHER, "all-gather in forward and in backward, reduce-scatter: "
                             "3(N-1)/N·S per rank, floor 3(N-1)/N·S/B", *_times(3),
                             _sum_of(LAYERWISE_GATHER_PARTS), LAYERWISE_GATHER_PARTS),
    RING_THEN_BROADCAST: Family(RING_THEN_BROADCAST, "allreduce, then the owners' broadcasts: 3(N-1)/N·S per "
                                "rank, floor 3(N-1)/N·S/B", *_times(3), _sum_of(RING_THEN_BROADCAST_PARTS),
                                RING_THEN_BROADCAST_PARTS),
}
# a stored result (a bench JSON) may name a family by the method that uses it: these read back as the family
STORED_NAMES = {"ring": RING_ALLREDUCE, "hierarchical": TWO_LEVEL}


def traffic_size(family: Family, wire: float, gathered: float | None = None) -> float:
    """The S at which `family`'s traffic and floor count one message of `wire` bytes whose parts that carry the
    parameters (compressed=False: zero's and fsdp's all-gathers) move `gathered` bytes instead: the parts' mean,
    weighted by what each moves per byte (zero+fp16's reduce-scatter carries half what its all-gather does; fsdp's
    all-gathers under bf16-mixed half what its reduce-scatter does). `wire` itself for a family of one collective."""
    if gathered is None or not family.parts:
        return wire
    return (sum(part.share * (wire if part.compressed else gathered) for part in family.parts)
            / sum(part.share for part in family.parts))


def family_named(name: str) -> Family:
    """The family a stored result names, under its own name or the one it was stored under."""
    return FAMILIES[STORED_NAMES.get(name, name)]


def family_of(method) -> Family | None:
    """The family a sync method (class or instance) declares in its traits' `family`, or None when it declares none."""
    name = method.traits.family
    if name is None:
        return None
    if name not in FAMILIES:
        cls = method if isinstance(method, type) else type(method)
        raise ValueError(f"{cls.__name__}.traits.family = {name!r} is not one of {sorted(FAMILIES)} "
                         f"(mpi_train/netmodel/families.py)")
    return FAMILIES[name]


def bus_bandwidth(size: float, world: int, seconds: float) -> float:
    """Bytes/s as nccl-tests report it for allreduce: S/t · 2(N-1)/N, comparable with the link bandwidth."""
    return size / seconds * 2 * (world - 1) / world if seconds > 0 else float("nan")
