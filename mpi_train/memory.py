"""Memory per rank, measured: the bytes a rank holds for parameters, gradients and optimizer state, from its tensors.

A sharded method (ZeRO, FSDP) buys memory with communication; this is the memory side of that
trade, counted the same way for every method and device. Each tensor is counted by the storage
it lives in, once: the views a flat buffer hands out as gradients (flat, bucketed) count as the
buffer, a DTensor (FSDP) as its local shard's storage (padding included). What is counted:

    parameters   model.parameters(), and what the method holds of that kind (its tensors(model, "held <kind>"))
    gradients    their .grad, and the method's gradient buffers
    optimizer    every tensor in the optimizer's state (for a wrapper that keeps a local optimizer
                 of its own shard, as ZeroRedundancyOptimizer's `optim`, that one's), and the method's

Buffers of torch's own that no public API reaches (autograd's activations; DistributedDataParallel's
gradient buckets, except that `ddp` builds it with gradient_as_bucket_view, so its gradients are those
buckets) are not counted: on CUDA the peak allocated (torch.cuda.max_memory_allocated) shows them.
A tensor counted under one kind is not counted again under another.

And where memory ran out: an allocation's failure told from other errors (ran_out), what it asked for and the
room there was (shortfall), whichever device raised it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from .sync.base import HELD_VIEW

KINDS = ("parameters", "gradients", "optimizer")  # what a rank holds, in the order a report lists them
UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # by their names lowered, for parsing


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` this rank holds: a DTensor's local shard, else the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """Every tensor in the optimizer's state, and in the state of a local optimizer it wraps (`optim`)."""
    found = []
    for holder in (optimizer, getattr(optimizer, "optim", None)):
        if holder is None or not hasattr(holder, "state"):
            continue
        for state in holder.state.values():  # a parameter's entry; not a dict where a wrapper keeps none for it
            if isinstance(state, dict):
                found.extend(value for value in state.values() if isinstance(value, torch.Tensor))
    return found


class StorageCount:
    """Bytes of distinct storages: a storage seen once is not counted again, whatever views reach it."""

    def __init__(self):
        self.seen: set[tuple] = set()

    def add(self, tensors: Iterable[torch.Tensor]) -> int:
        total = 0
        for tensor in tensors:
            tensor = local(tensor)
            if tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            if storage.nbytes() == 0 or key in self.seen:
                continue
            self.seen.add(key)
            total += storage.nbytes()
        return total


def count_peak_from_here(device: torch.device) -> int:
    """On CUDA, the peak allocated counts from here, a job's start; the bytes allocated already, which held_bytes
    takes off it (`before`). So a process that runs several jobs one after another (the GPU check) reports each job's
    own peak, not the largest since it began nor what an earlier job left allocated. 0 on a CPU."""
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def held_bytes(model: nn.Module, optimizer, method=None, before: int = 0) -> dict[str, int]:
    """Bytes this rank holds by kind (KINDS) and in all (`total_bytes`): keys `parameters_bytes`, ...; on CUDA also
    `cuda_peak_bytes`, the most allocated at once since the job began beyond the `before` bytes allocated then
    (count_peak_from_here)."""
    params = list(model.parameters())
    extra = {kind: method.tensors(model, HELD_VIEW + kind) for kind in KINDS} if method is not None else {}
    tensors = {"parameters": params,
               "gradients": [p.grad for p in params if p.grad is not None],
               "optimizer": optimizer_tensors(optimizer)}
    counted = StorageCount()
    figures = {f"{kind}_bytes": counted.add([*tensors[kind], *extra.get(kind, [])]) for kind in KINDS}
    figures["total_bytes"] = sum(figures.values())
    device = params[0].device if params else torch.device("cpu")
    if device.type == "cuda":
        figures["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
    return figures


def most(per_rank: list[dict]) -> dict[str, int]:
    """The most any rank held, figure by figure (what a device must have room for)."""
    return {key: max(rank[key] for rank in per_rank) for key in per_rank[0]} if per_rank else {}


def megabytes(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


def describe(figures: dict) -> str:
    """The console's words: `parameters 35.2 MiB, gradients 35.2 MiB, optimizer 35.2 MiB (total 105.5 MiB)`."""
    kinds = ", ".join(f"{kind} {megabytes(figures[f'{kind}_bytes'])}" for kind in KINDS)
    peak = f", CUDA peak {megabytes(figures['cuda_peak_bytes'])}" if "cuda_peak_bytes" in figures else ""
    return f"{kinds} (total {megabytes(figures['total_bytes'])}{peak})"


def predicted(figures: dict) -> str:
    """The model's words beside the measured: `model 52.8 MiB (+9.0 MiB while a unit is gathered)`. A rank holds the
    gathered unit (ZeRO-3) only while it computes, so the measured figure, taken between steps, leaves it out."""
    between = figures["total_bytes"] - figures.get("gathered_bytes", 0)
    return f"model {megabytes(between)}" + (f" (+{megabytes(figures['gathered_bytes'])} while a unit is gathered)"
                                            if figures.get("gathered_bytes") else "")


# What torch says when an allocation fails: CUDA's caching allocator (torch.OutOfMemoryError), the CPU's allocator
# (a RuntimeError), MPS, and cuBLAS or cuDNN failing to allocate their workspace
RAN_OUT = re.compile(r"out of memory|can't allocate memory|_ALLOC_FAILED|NOT_ENOUGH_WORKSPACE", re.IGNORECASE)
ASKED_BYTES = re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE)  # the CPU's allocator
ASKED_SIZE = re.compile(r"tried to allocate ([\d.]+ ?[KMGT]?i?B)", re.IGNORECASE)  # CUDA's and MPS's
CUDA_ROOM = re.compile(r"total capacity of ([\d.]+ ?[KMGT]?i?B) of which ([\d.]+ ?[KMGT]?i?B) is free")


def ran_out(error: BaseException) -> bool:
    """Whether `error` is an allocation that failed for want of memory, on whichever device."""
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(error, RuntimeError) and bool(RAN_OUT.search(str(error))))


def size(nbytes: float) -> str:
    """Bytes in the largest unit that keeps a number of at least 1: `1.50 GiB`."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if nbytes >= UNITS[unit.lower()]:
            return f"{nbytes / UNITS[unit.lower()]:.2f} {unit}"
    return f"{nbytes:.0f} B"


def shortfall(error: BaseException) -> str:
    """What the failed allocation asked for and the room the device had, as far as torch's message and the system
    say: `one allocation asked for 36.6 GiB, with 21.9 GiB of the host's 23.4 GiB free`."""
    text = str(error)
    in_bytes, sized = ASKED_BYTES.search(text), ASKED_SIZE.search(text)
    asked = size(int(in_bytes.group(1))) if in_bytes else sized.group(1) if sized else None
    said = f"one allocation asked for {asked}" if asked else "an allocation failed"
    on_gpu = CUDA_ROOM.search(text)
    if on_gpu:
        return f"{said}, with {on_gpu.group(2)} of the GPU's {on_gpu.group(1)} free"
    host = host_memory()
    if "CPU" in text and host:
        return f"{said}, with {size(host[0])} of the host's {size(host[1])} free"
    return said


def host_memory() -> tuple[int, int] | None:
    """(available, total) bytes of this host's memory, from the kernel's /proc/meminfo; None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return tuple(int(fields[name].split()[0]) * 1024 for name in ("MemAvailable", "MemTotal"))
    except (OSError, KeyError, ValueError):
        return None
