"""How a sync method's gradients travel: one message per tensor, one buffer, buckets cut by DDP's rule, or one per
layer block (FSDP's units).

A method says which in its traits' `messages` (traits.py); `bucketed` cuts its buckets
here, and the cost model (netmodel/prediction.py) cuts the same messages to price them.
"""

from __future__ import annotations

from collections.abc import Sequence

PER_TENSOR = "per tensor"  # one collective per gradient: L latencies (allreduce, gather_scatter)
ONE_BUFFER = "one buffer"  # every gradient in one flat buffer, one collective (flat, ring, hierarchical)
BUCKETS = "buckets"  # buckets filled in backward order, each reduced once full (ddp, bucketed)
PER_UNIT = "per unit"  # one message per layer block (FSDP's units: each gathered and reduce-scattered alone)

DDP_BUCKET_MB = 25.0  # DistributedDataParallel's default bucket_cap_mb
DDP_FIRST_BUCKET_MB = 1.0  # and its first bucket's cap (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)


def fill_buckets(sizes: Sequence[float], bucket_bytes: float, first_bucket_bytes: float,
                 kinds: Sequence | None = None) -> list[list[int]]:
    """DistributedDataParallel's bucket rule, as indices into `sizes` (taken in the order backward produces them).

    A bucket closes once it holds at least its cap, so the tensor that crosses the cap
    travels in it; the first bucket's cap is small, so the last layer's gradients leave
    as soon as backward has them rather than waiting for 25 MB to follow. A bucket also
    closes before a tensor of another kind (dtype, device), which cannot share its buffer.
    """
    groups: list[list[int]] = []
    size = 0.0
    for i, nbytes in enumerate(sizes):
        cap = first_bucket_bytes if len(groups) == 1 else bucket_bytes
        if not groups or size >= cap or (kinds is not None and kinds[i] != kinds[groups[-1][0]]):
            groups.append([])
            size = 0.0
        groups[-1].append(i)
        size += nbytes
    return groups


def backward_order(count: int, order: Sequence[int] | None = None) -> list[int]:
    """Tensor indices (registration order) in the order backward hands their gradients over: `order` as measured
    (autograd's, from a first step), else the last tensor first."""
    if order is not None and sorted(order) == list(range(count)):
        return list(order)
    return list(reversed(range(count)))


def message_groups(tensor_bytes: Sequence[float], messages: str, caps: tuple[float, float] | None = None,
                   order: Sequence[int] | None = None, units: Sequence[int] | None = None) -> list[list[int]]:
    """The tensors (indices in registration order) each message carries, in the order they are sent. Buckets fill
    in backward order (`order`, see backward_order) with caps (first, rest) in bytes; per unit, each layer block
    (`units`: each tensor's, as netmodel.tensor_units gives them; without, each tensor its own) is one message, sent
    when backward reaches it."""
    count = len(tensor_bytes)
    if messages == PER_TENSOR:
        return [[i] for i in range(count)]
    if messages == ONE_BUFFER:
        return [list(range(count))]
    if messages == PER_UNIT:
        blocks = units if units is not None and len(units) == count else range(count)
        grouped: dict[int, list[int]] = {}
        for i in backward_order(count, order):
            grouped.setdefault(blocks[i], []).append(i)
        return list(grouped.values())
    if messages != BUCKETS:
        raise ValueError(f"unknown message layout {messages!r}; one of {PER_TENSOR!r}, {ONE_BUFFER!r}, {BUCKETS!r}, "
                         f"{PER_UNIT!r}")
    first, rest = caps or (DDP_FIRST_BUCKET_MB * 2**20, DDP_BUCKET_MB * 2**20)
    ordered = backward_order(count, order)
    groups = fill_buckets([tensor_bytes[i] for i in ordered], rest, first)
    return [[ordered[i] for i in group] for group in groups]
