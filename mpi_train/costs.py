"""Cost models of gradient sync: bytes each rank moves, and the time floor a link of bandwidth B allows.

A sync method names its model with the class attribute `cost_model` (see sync/base.py);
the benchmark looks it up here. For S bytes of gradients on N ranks:

- `ring` (bandwidth-optimal allreduce: ring, or reduce-scatter + all-gather): every rank
  sends and receives 2(N-1)/N·S, all links busy at once, so the floor is 2(N-1)/N·S/B.
- `root` (gather to rank 0, scatter back): rank 0 receives (N-1)·S and sends (N-1)·S, the
  others send S and receive S; rank 0's one link carries everything, so the floor is 2(N-1)·S/B.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class CostModel:
    """How one family of algorithms moves S bytes of gradients among N ranks."""

    describe: str
    traffic: Callable[[float, int, int], tuple[float, float]]  # (S, N, rank) -> (bytes sent, bytes received)
    floor: Callable[[float, int, float], float]  # (S, N, B bytes/s) -> seconds


def _ring_traffic(size: float, world: int, rank: int) -> tuple[float, float]:
    moved = 2 * (world - 1) / world * size
    return moved, moved


def _root_traffic(size: float, world: int, rank: int) -> tuple[float, float]:
    if world == 1:
        return 0.0, 0.0
    moved = (world - 1) * size if rank == 0 else size
    return moved, moved


COST_MODELS: dict[str, CostModel] = {
    "ring": CostModel("2(N-1)/N·S per rank, floor 2(N-1)/N·S/B", _ring_traffic,
                      lambda size, world, bandwidth: 2 * (world - 1) / world * size / bandwidth),
    "root": CostModel("rank 0 moves 2(N-1)·S, others 2·S, floor 2(N-1)·S/B", _root_traffic,
                      lambda size, world, bandwidth: 2 * (world - 1) * size / bandwidth),
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
    """S as the method sends it: the gradients' bytes, scaled when its messages carry another dtype (compression)."""
    dtype = getattr(method_class, "wire_dtype", None)
    return gradient_bytes if dtype is None else gradient_bytes * dtype.itemsize / gradient_itemsize


def bus_bandwidth(size: float, world: int, seconds: float) -> float:
    """Bytes/s as nccl-tests report it for allreduce: S/t · 2(N-1)/N, comparable with the link bandwidth."""
    return size / seconds * 2 * (world - 1) / world if seconds > 0 else float("nan")
