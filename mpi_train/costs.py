"""Cost models of gradient sync: bytes each rank moves, and the time floor a link of bandwidth B allows.

A sync method names its model with the class attribute `cost_model` (see sync/base.py);
the benchmark looks it up here. For S bytes of gradients on N ranks:

- `ring` (bandwidth-optimal allreduce: ring, or reduce-scatter + all-gather): every rank
  sends and receives 2(N-1)/N·S, all links busy at once, so the floor is 2(N-1)/N·S/B.
- `root` (gather to rank 0, scatter back): rank 0 receives (N-1)·S and sends (N-1)·S, the
  others send S and receive S; rank 0's one link carries everything, so the floor is 2(N-1)·S/B.
- `hierarchical` (reduce to each host's leader, allreduce among the H leaders, broadcast in
  the host): only the leaders use the network, each sending and receiving 2(H-1)/H·S there,
  so the floor is 2(H-1)/H·S/B; the other ranks move S each way through shared memory,
  which the model counts as free. On one host (or one rank per host) it is `ring`.

S is what the method sends per step: the gradients' bytes, or fewer for a compressing
method (half for fp16/bf16; PowerSGD: (n+m)·r per n x m matrix plus the vectors), see
SyncMethod.wire_bytes. `hosts` (each rank's host) matters only to `hierarchical`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence


@dataclass(frozen=True)
class CostModel:
    """How one family of algorithms moves S bytes of gradients among N ranks."""

    describe: str
    traffic: Callable[..., tuple[float, float]]  # (S, N, rank, hosts=None) -> (bytes sent, bytes received)
    floor: Callable[..., float]  # (S, N, B bytes/s, hosts=None) -> seconds


def _ring_traffic(size: float, world: int, rank: int, hosts: Optional[Sequence[str]] = None) -> tuple[float, float]:
    moved = 2 * (world - 1) / world * size
    return moved, moved


def _ring_floor(size: float, world: int, bandwidth: float, hosts: Optional[Sequence[str]] = None) -> float:
    return 2 * (world - 1) / world * size / bandwidth


def _levels(world: int, hosts: Optional[Sequence[str]]) -> Optional[list[str]]:
    """The distinct hosts in rank order, when a two-level allreduce has two levels to use; else None."""
    distinct = list(dict.fromkeys(hosts)) if hosts else []
    return distinct if 1 < len(distinct) < world else None


def _hierarchical_traffic(size: float, world: int, rank: int, hosts: Optional[Sequence[str]] = None) -> tuple[float, float]:
    levels = _levels(world, hosts)
    if levels is None:
        return _ring_traffic(size, world, rank)
    leader = hosts.index(hosts[rank]) == rank  # the host's lowest rank
    moved = 2 * (len(levels) - 1) / len(levels) * size if leader else 0.0
    return moved, moved


def _hierarchical_floor(size: float, world: int, bandwidth: float, hosts: Optional[Sequence[str]] = None) -> float:
    levels = _levels(world, hosts)
    if levels is None:
        return _ring_floor(size, world, bandwidth)
    return 2 * (len(levels) - 1) / len(levels) * size / bandwidth


def _root_traffic(size: float, world: int, rank: int, hosts: Optional[Sequence[str]] = None) -> tuple[float, float]:
    if world == 1:
        return 0.0, 0.0
    moved = (world - 1) * size if rank == 0 else size
    return moved, moved


COST_MODELS: dict[str, CostModel] = {
    "ring": CostModel("2(N-1)/N·S per rank, floor 2(N-1)/N·S/B", _ring_traffic, _ring_floor),
    "root": CostModel("rank 0 moves 2(N-1)·S, others 2·S, floor 2(N-1)·S/B", _root_traffic,
                      lambda size, world, bandwidth, hosts=None: 2 * (world - 1) * size / bandwidth),
    "hierarchical": CostModel("host leaders move 2(H-1)/H·S over the network, others S each way in memory; "
                              "floor 2(H-1)/H·S/B (one host: ring)", _hierarchical_traffic, _hierarchical_floor),
}


def cost_model_of(method_class: type) -> Optional[CostModel]:
    """The method's declared cost model, or None when it declares none (the benchmark then shows n/a)."""
    name = getattr(method_class, "cost_model", None)
    if name is None:
        return None
    if name not in COST_MODELS:
        raise ValueError(f"{method_class.__name__}.cost_model = {name!r} is not one of {sorted(COST_MODELS)} (mpi_train/costs.py)")
    return COST_MODELS[name]


def wire_bytes(method_class: type, gradient_bytes: float, gradient_itemsize: int = 4) -> float:
    """S as a method class sends it, when only its dtype changes the bytes (for a configured method, with any
    compressor, use its own `wire_bytes(params)`): the gradients' bytes, scaled to its wire dtype."""
    dtype = getattr(method_class, "wire_dtype", None)
    return gradient_bytes if dtype is None else gradient_bytes * dtype.itemsize / gradient_itemsize


def bus_bandwidth(size: float, world: int, seconds: float) -> float:
    """Bytes/s as nccl-tests report it for allreduce: S/t · 2(N-1)/N, comparable with the link bandwidth."""
    return size / seconds * 2 * (world - 1) / world if seconds > 0 else float("nan")
