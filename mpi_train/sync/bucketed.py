"""bucketed: gradients grouped into buckets in backward order, each allreduced as soon as it is full."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .base import EVERY_COMPRESSION, SyncMethod
from .flat import FlatBuffer

DEFAULT_BUCKET_MB = 25.0  # DistributedDataParallel's default bucket_cap_mb
FIRST_BUCKET_MB = 1.0  # and its first bucket's cap (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)


def fill_buckets(sizes: Sequence[float], bucket_bytes: float, first_bucket_bytes: float,
                 kinds: Optional[Sequence] = None) -> list[list[int]]:
    """DistributedDataParallel's bucket rule, as indices into `sizes` (taken in backward order).

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


class Bucket:
    """A few consecutive parameters (in backward order) sharing one flat buffer and one allreduce."""

    def __init__(self, index: int, params: list[nn.Parameter]):
        self.index = index
        self.buffer = FlatBuffer(params)
        self.waiting = len(params)  # gradients not yet arrived this step
        self.work: dist.Work | None = None  # the in-flight allreduce once launched
        self.rounds = None  # the compressor's messages for this step, once launched


class Bucketed(SyncMethod):
    """Our own DistributedDataParallel in one file: communication overlaps the rest of backward.

    wrap() cuts the parameters, in reverse registration order (roughly the order
    backward produces their gradients: last layer first), into buckets of about
    `bucket_mb` megabytes, the first of at most 1 MB, by DDP's rule (fill_buckets). A post-accumulate-grad hook on each parameter copies its
    finished gradient into its bucket's buffer; when a bucket's last gradient arrives
    its all_reduce(SUM) is started asynchronously and backward carries on with the
    earlier layers while the bytes travel. Buckets are launched strictly in index
    order (a bucket that fills early waits for the ones before it), because every
    rank must issue its collectives in the same order.

    sync() then only waits for the last buckets and finishes the average, so the
    sync phase the training loop times is the communication backward could not hide;
    the rest of the communication shows up inside compute time (as with `ddp`).

    The gradients handed to the optimizer are views of the bucket buffers. A parameter
    that received no gradient this step (unused in forward) contributes zeros and keeps
    .grad None, like `allreduce` leaves it; as there, every rank must use the same
    parameters. One backward per sync: accumulating over several backward passes
    before syncing is refused, since a launched bucket would miss the later gradients.

    With a compressor the first message of each bucket (the whole bucket, its float16
    copy, or PowerSGD's P factors) leaves during backward; a compressor's later rounds
    (PowerSGD's Q) depend on the first round's sum, so sync() runs them, all buckets'
    round k before any bucket's round k+1, in bucket order on every rank.
    """

    cost_model = "ring"  # the same bytes as one allreduce, sent in buckets; Gloo and NCCL run each bandwidth-optimally
    compressions = EVERY_COMPRESSION

    def __init__(self, bucket_mb: float = DEFAULT_BUCKET_MB, compressor=None):
        super().__init__(compressor)
        if bucket_mb <= 0:
            raise ValueError(f"bucket size must be positive, got {bucket_mb} MB")
        self.bucket_bytes = bucket_mb * 2**20
        self.first_bucket_bytes = min(FIRST_BUCKET_MB, bucket_mb) * 2**20
        self.buckets: list[Bucket] = []
        self.next_to_launch = 0  # buckets before this index are in flight (or done) this step

    @classmethod
    def from_config(cls, config) -> "Bucketed":
        return cls(config.bucket_mb, cls.compressor_from_config(config))

    def wrap(self, model: nn.Module) -> nn.Module:
        params = [p for p in model.parameters() if p.requires_grad][::-1]
        self.buckets = [Bucket(i, group) for i, group in enumerate(self.split(params))]
        for bucket in self.buckets:
            for p, view in zip(bucket.buffer.params, bucket.buffer.views):
                p.register_post_accumulate_grad_hook(self.make_hook(bucket, view))
        return model

    def split(self, params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
        """The parameters (in backward order) grouped into buckets by fill_buckets."""
        sizes = [p.numel() * p.element_size() for p in params]
        kinds = [(p.dtype, p.device) for p in params]
        return [[params[i] for i in group] for group in fill_buckets(sizes, self.bucket_bytes, self.first_bucket_bytes, kinds)]

    def make_hook(self, bucket: Bucket, view: torch.Tensor):
        def gradient_ready(param: nn.Parameter) -> None:
            if bucket.work is not None:
                raise RuntimeError(
                    "bucketed sync: a gradient arrived for a bucket already being reduced. Call sync() "
                    "after every backward (gradient accumulation over several backward passes is not supported)."
                )
            view.copy_(param.grad)
            bucket.waiting -= 1
            if bucket.waiting == 0:
                self.launch_ready()
        return gradient_ready

    def launch_ready(self) -> None:
        """Start the allreduce of every full bucket whose predecessors have all started."""
        while self.next_to_launch < len(self.buckets) and self.buckets[self.next_to_launch].waiting == 0:
            self.launch(self.buckets[self.next_to_launch])

    def launch(self, bucket: Bucket) -> None:
        buffer = bucket.buffer
        bucket.rounds = self.compressor.rounds(buffer.params, buffer.data, buffer.views, dist.get_world_size())
        bucket.work = dist.all_reduce(next(bucket.rounds), op=dist.ReduceOp.SUM, async_op=True)
        self.next_to_launch = bucket.index + 1

    def sync(self, model: nn.Module) -> None:
        for bucket in self.buckets[self.next_to_launch:]:  # some gradient never came: unused parameters
            bucket.buffer.pack()  # zeros for the missing ones (the arrived ones are copied again, unchanged)
            self.launch(bucket)
        pending = self.buckets
        while pending:  # one pass per round of the compressor, buckets in index order: the same on every rank
            still = []
            for bucket in pending:
                bucket.work.wait()
                message = next(bucket.rounds, None)  # finishes the bucket's average once its last round is summed
                if message is None:
                    bucket.buffer.unpack()
                    bucket.work, bucket.rounds, bucket.waiting = None, None, len(bucket.buffer.params)
                else:
                    bucket.work = dist.all_reduce(message, op=dist.ReduceOp.SUM, async_op=True)
                    still.append(bucket)
            pending = still
        self.next_to_launch = 0
