"""bucketed: gradients grouped into buckets in the order backward produces them, each allreduced as soon as it is
full."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..errors import UserError
from ..timeline import coded, now
from .base import DURING_BACKWARD, EVERY_COMPRESSION, SyncMethod, compressor_for
from .flag_fields import option, option_names
from .flat import FlatBuffer
from .messages import BUCKETS, DDP_BUCKET_MB, DDP_FIRST_BUCKET_MB, fill_buckets
from .traits import RING_ALLREDUCE, Traits

DEFAULT_BUCKET_MB = DDP_BUCKET_MB  # DistributedDataParallel's default bucket_cap_mb


@dataclass(frozen=True)
class BucketOptions:
    """--bucket-mb, read by bucketed and zero (TrainConfig composes it). It defaults to None, so a job can tell the
    flag given to a method that would ignore it (ddp keeps DistributedDataParallel's own buckets)."""

    bucket_mb: float | None = option(None, f"bucket size in megabytes for --sync bucketed and zero: smaller buckets "
                                     f"start communicating earlier in backward, larger ones make fewer calls "
                                     f"(default: {DEFAULT_BUCKET_MB:g})")

    @property
    def bucket_size_mb(self) -> float:
        """--bucket-mb as bucketed and zero run it: given, or the default."""
        return DEFAULT_BUCKET_MB if self.bucket_mb is None else self.bucket_mb

    def check_buckets(self) -> None:
        """Refused before any work starts, like every flag a job cannot run."""
        if self.bucket_mb is not None and self.bucket_mb <= 0:
            raise UserError(f"--bucket-mb must be positive, got {self.bucket_mb}. Pass a value greater than zero.")


class Bucket:
    """A few parameters, consecutive in backward order, sharing one flat buffer and one allreduce."""

    def __init__(self, index: int, params: list[nn.Parameter], multiple_of: int = 1):
        self.index = index
        self.params = params
        self.multiple_of = multiple_of  # its buffer's length, padded (zero.py cuts it into one shard per rank)
        self.held: FlatBuffer | None = None
        self.waiting = len(params)  # gradients not yet arrived this step
        self.work: dist.Work | None = None  # the in-flight allreduce once launched
        self.rounds = None  # the compressor's messages for this step, once launched

    @property
    def buffer(self) -> FlatBuffer:
        """Its flat buffer, allocated when first needed: a method that keeps only a shard of the gradients between
        steps drops it (`release`) once its messages are done."""
        if self.held is None:
            self.held = FlatBuffer(self.params, self.multiple_of)
        return self.held

    def release(self) -> None:
        self.held = None


class Bucketed(SyncMethod):
    """Our own DistributedDataParallel in one file: communication overlaps the rest of backward.

    The first step learns the order in which backward hands the gradients over (autograd's
    order: a layer's weight before its bias, which registration order does not tell) and
    reduces them all in sync(); rank 0's order is then used on every rank, as DDP rebuilds
    its buckets after its first iteration. From then on the parameters are cut, in that
    order, into buckets of about `bucket_mb` megabytes, the first of at most 1 MB, by DDP's
    rule (messages.fill_buckets). A post-accumulate-grad hook on each parameter copies its
    finished gradient into its bucket's buffer; when a bucket's last gradient arrives its
    all_reduce(SUM) is started asynchronously and backward carries on with the earlier
    layers while the bytes travel. Buckets are launched strictly in index order (a bucket
    that fills early waits for the ones before it), because every rank must issue its
    collectives in the same order.

    sync() then only waits for the last buckets and finishes the average, so the
    sync phase the training loop times is the communication backward could not hide;
    the rest of the communication shows up inside compute time (as with `ddp`).

    The gradients handed to the optimizer are views of the bucket buffers. A parameter
    that received no gradient this step (unused in forward) contributes zeros and keeps
    .grad None, like `allreduce` leaves it; as there, every rank must use the same
    parameters. Under --accumulate the hooks are held (`accumulating`) for every micro-batch but
    the last, whose backward launches the buckets with the summed gradients.

    With a compressor the first message of each bucket (the whole bucket, its float16
    copy, or PowerSGD's P factors) leaves during backward; a compressor's later rounds
    (PowerSGD's Q) depend on the first round's sum, so sync() runs them, all buckets'
    round k before any bucket's round k+1, in bucket order on every rank.
    """

    # the same bytes as one allreduce, sent in buckets that follow --bucket-mb; Gloo and NCCL run each
    # bandwidth-optimally; sync() runs a compressor's later rounds (above)
    traits = Traits(family=RING_ALLREDUCE, tunables=option_names(BucketOptions), messages=BUCKETS,
                    sends=DURING_BACKWARD, later_rounds_after_backward=True, compressions=EVERY_COMPRESSION,
                    lost_when_compiled="its buckets leave at the end of backward, not as backward fills them (a "
                                       "compiled backward hands over every gradient at its end): backward no longer "
                                       "hides their messages")

    def __init__(self, bucket_mb: float = DEFAULT_BUCKET_MB, compressor=None):
        super().__init__(compressor)
        if bucket_mb <= 0:
            raise ValueError(f"bucket size must be positive, got {bucket_mb} MB")
        self.bucket_bytes = bucket_mb * 2**20
        self.first_bucket_bytes = min(DDP_FIRST_BUCKET_MB, bucket_mb) * 2**20
        self.traits = self.traits.configured(bucket_caps=(self.first_bucket_bytes, self.bucket_bytes))
        self.params: list[nn.Parameter] = []  # registration order
        self.arrivals: list[int] | None = None  # the first step: indices in the order their gradients came
        self.buckets: list[Bucket] = []
        self.slot: dict[int, tuple[Bucket, torch.Tensor]] = {}  # parameter index -> its bucket and view
        self.next_to_launch = 0  # buckets before this index are in flight (or done) this step
        self.holding = False  # a micro-batch that is not the step's last: its gradients only add up (accumulating)

    @classmethod
    def _from_config(cls, config) -> Bucketed:
        return cls(config.bucket_size_mb, compressor_for(cls, config))

    def wrap(self, model: nn.Module) -> nn.Module:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.arrivals = []
        for index, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(self.make_hook(index))
        return model

    @contextlib.contextmanager
    def accumulating(self, net: nn.Module):
        self.holding = True
        try:
            yield
        finally:
            self.holding = False

    def split(self, order: list[int]) -> list[list[int]]:
        """Parameter indices, in backward `order`, grouped into buckets by fill_buckets."""
        params = [self.params[i] for i in order]
        sizes = [p.numel() * p.element_size() for p in params]
        kinds = [(p.dtype, p.device) for p in params]
        return [[order[i] for i in group]
                for group in fill_buckets(sizes, self.bucket_bytes, self.first_bucket_bytes, kinds)]

    def build(self, order: list[int]) -> None:
        """The buckets for parameters in backward `order` (the same on every rank)."""
        self.buckets, self.slot = [], {}
        for number, group in enumerate(self.split(order)):
            bucket = self.new_bucket(number, [self.params[i] for i in group])
            self.buckets.append(bucket)
            for position, index in enumerate(group):
                self.slot[index] = (bucket, position)

    def new_bucket(self, index: int, params: list[nn.Parameter]) -> Bucket:
        return Bucket(index, params)

    def make_hook(self, index: int):
        def gradient_ready(param: nn.Parameter) -> None:
            if self.holding:  # more micro-batches to come: the gradient is not complete yet
                return
            if self.arrivals is not None:  # the first step: only learn the order
                self.arrivals.append(index)
                return
            bucket, position = self.slot[index]
            if bucket.work is not None:
                raise RuntimeError(
                    "bucketed sync: a gradient arrived for a bucket already being reduced. Call sync() after "
                    "every backward, or hold the hooks with accumulating() for the backward passes before it."
                )
            bucket.buffer.views[position].copy_(param.grad)
            bucket.waiting -= 1
            if bucket.waiting == 0:
                self.launch_ready()
        return gradient_ready

    def backward_order(self) -> list[int]:
        """Rank 0's order of arrival in the first step (parameters that got no gradient last), on every rank."""
        seen = list(dict.fromkeys(self.arrivals))
        arrived = set(seen)
        order = seen + [i for i in reversed(range(len(self.params))) if i not in arrived]
        shared = torch.tensor(order, dtype=torch.int64, device=self.params[0].device)
        dist.broadcast(shared, src=0)  # autograd's order is the same everywhere, but ranks must not even risk differing
        return shared.tolist()

    def launch_ready(self) -> None:
        """Start the allreduce of every full bucket whose predecessors have all started."""
        while self.next_to_launch < len(self.buckets) and self.buckets[self.next_to_launch].waiting == 0:
            self.launch(self.buckets[self.next_to_launch])

    def launch(self, bucket: Bucket) -> None:
        buffer = bucket.buffer
        bucket.rounds = self.compressor.rounds(buffer.params, buffer.data, buffer.views, dist.get_world_size())
        self.send(bucket, self.next_message(bucket))
        self.next_to_launch = bucket.index + 1

    def next_message(self, bucket: Bucket):
        """The compressor's next message for `bucket` (None once its average is done); its work, a codec interval."""
        return coded(self._recorder, next, bucket.rounds, None, bucket=bucket.index)

    def send(self, bucket: Bucket, message: torch.Tensor) -> None:
        """Start summing `message` across ranks, noted as a message that ends when the sum completes."""
        start = now()
        bucket.work = dist.all_reduce(message, op=dist.ReduceOp.SUM, async_op=True)
        noted = self._recorder.message("allreduce", start, None, message.numel() * message.element_size(), bucket.index)
        self._recorder.after(noted, bucket.work.get_future())

    def sync(self, model: nn.Module) -> None:
        if self.arrivals is not None:  # the first step: buckets now, in the order just seen, all sent from here
            self.build(self.backward_order())
            self.arrivals = None
        for bucket in self.buckets[self.next_to_launch:]:  # not launched in backward: the first step, unused parameters
            bucket.buffer.pack()  # zeros for the missing ones (the arrived ones are copied again, unchanged)
            self.launch(bucket)
        pending = self.buckets
        while pending:  # one pass per round of the compressor, buckets in index order: the same on every rank
            still = []
            for bucket in pending:
                bucket.work.wait()
                message = self.next_message(bucket)  # finishes the bucket's average once its last round is summed
                if message is None:
                    bucket.buffer.unpack()
                    bucket.work, bucket.rounds, bucket.waiting = None, None, len(bucket.params)
                else:
                    self.send(bucket, message)
                    still.append(bucket)
            pending = still
        self.next_to_launch = 0
