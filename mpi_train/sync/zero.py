"""zero: ZeRO stages 1-2 in one file: gradients reduce-scattered as buckets fill in backward, each rank steps its own
shard, then the parameters are all-gathered."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from ..timeline import coded, now
from .base import GRADIENTS_AND_STATE, Synced, compressor_for
from .bucketed import DEFAULT_BUCKET_MB, Bucket, Bucketed
from .flat import padded_length
from .messages import backward_order
from .ring import ring_reduce_scatter
from .traits import REDUCE_SCATTER as REDUCE_SCATTER_FAMILY

# torch 2.14 names them *_single and warns at the old names; the releases before have the old names only
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

REDUCE_SCATTER, ALL_GATHER = "reduce-scatter", "all-gather"  # its messages, as a timeline names them


class RingReduceScatters:
    """Reduce-scatters run as a ring of our own (ring.ring_reduce_scatter): zero's path on Gloo, whose own
    reduce_scatter_single allreduces the whole buffer and keeps a slice, twice a ring's bytes.

    A ring is N-1 exchanges with a sum between them, not one call that returns at once, so a
    thread of its own runs them, one bucket after another in the order they were started (the
    same on every rank), on a process group of its own opened here (collective), as a
    background model average does (background.py): the main thread's collectives (the
    all-gathers, a logged step's figures) come at points the thread does not know. Its waits
    and sums release the GIL, so backward runs on meanwhile."""

    def __init__(self, timeout: timedelta | None = None):
        self.group = dist.new_group(list(range(dist.get_world_size())), timeout=timeout)
        self.todo: queue.Queue = queue.Queue()
        threading.Thread(target=self.run, name="zero reduce-scatter", daemon=True).start()

    def start(self, shard: torch.Tensor, whole: torch.Tensor, finished: Callable[[], None] = lambda: None) -> RingWork:
        """`shard` gets the sum across ranks of this rank's 1/N of `whole` (summed into) in the background;
        `finished` is called on the thread as soon as it is done (a timeline notes the message's end there)."""
        work = RingWork()
        self.todo.put((shard, whole, work, finished))
        return work

    def run(self) -> None:
        while True:
            shard, whole, work, finished = self.todo.get()
            try:
                ring_reduce_scatter(whole, shard, self.group)
                finished()
            except BaseException as error:  # noqa: BLE001 - handed to the main thread, which raises it in wait()
                work.error = error
            work.done.set()


class RingWork:
    """One reduce-scatter handed to RingReduceScatters: wait() blocks until it is done and re-raises its error."""

    def __init__(self):
        self.done, self.error = threading.Event(), None

    def wait(self) -> bool:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return True


def pieces(flat: torch.Tensor, params: Iterable[nn.Parameter]) -> list[torch.Tensor]:
    """Views of `flat`, one per parameter in order, each shaped like it: a bucket's layout (padding left out)."""
    params = list(params)
    sizes = [p.numel() for p in params]
    return [piece.view_as(p) for piece, p in zip(torch.split(flat[:sum(sizes)], sizes), params)]


def shard_bounds(count: int, world: int, rank: int) -> tuple[int, int]:
    """The slice [start, end) of a bucket of `count` numbers, padded to a multiple of `world`, that `rank` owns: 785
    numbers on 3 ranks pad to 786, rank 2 owns [524, 786), of which [524, 785) are real."""
    size = padded_length(count, world) // world
    return rank * size, (rank + 1) * size


# every step: the gradients reduce-scattered, then the updated parameters all-gathered after the optimizer step
GATHERED = Synced(scope="all", averaged=True)


class Zero(Bucketed):
    """A ring allreduce is a reduce-scatter followed by an all-gather; ZeRO moves the optimizer between the two.

    The buckets are `bucketed`'s (its hooks, its --bucket-mb, DDP's cutting rule), cut at
    the start in reverse registration order (the order backward usually hands gradients
    over: the shards must exist before the first step, because the optimizer is built over
    them). Each bucket's flat buffer is padded with zeros to a multiple of N; when its last
    gradient arrives, a reduce-scatter (asynchronous, so backward carries on) leaves each
    rank the sum of its 1/N of the bucket only. sync() waits for the rest and divides by N:
    that slice's mean gradient is the .grad of this rank's copy of its slice of the
    parameters. The job's optimizer (make_optimizer) steps those copies alone, so its
    state covers 1/N of the model: SGD's and AdamW's updates are elementwise,
    which makes stepping slices the same arithmetic as stepping the whole. after_step()
    then starts the all-gather of every bucket's updated slices, the first layers' bucket
    first, and returns: the next forward waits for a bucket (a pre-hook on each module with
    parameters) only when it reaches the first layer whose parameters the bucket holds, and
    copies them in, so the all-gather overlaps the next forward as the reduce-scatter
    overlaps backward. Whatever reads the parameters between steps (the replica check,
    evaluation, checkpoints, the end) waits for all of them first (`settle`). The model's
    own .grad is dropped once copied and the full-size buffers after the reduce-scatter, so
    between steps a rank holds 1/N of the gradients (ZeRO-2).

    Bytes per rank: (N-1)/N·S for the reduce-scatter plus (N-1)/N·S for the all-gather, a
    ring allreduce's 2(N-1)/N·S. On Gloo the reduce-scatters are a ring of our own on a thread
    (RingReduceScatters): Gloo's reduce_scatter_single allreduces the whole bucket and keeps a
    slice, 2(N-1)/N·S, as slow as bucketed's allreduce.
    Under --compile the pre-hooks wait for every bucket before the forward's graph starts (a graph
    cannot wait on a future), so the all-gathers do not overlap the forward there.
    In a timeline each all-gather is noted from its start after
    the step to the wait in the next forward. Any collective between two steps (a logged
    step's gather of figures) runs after the all-gathers in flight, so it waits for them.
    With --compression fp16|bf16 each rank's share of the mean travels in the narrow type
    (as in bucketed); the all-gather carries the parameters in their own type. A parameter
    that gets no gradient in a step adds zeros to its slice (and weight decay still applies
    to it, which an optimizer over the whole model skips).
    """

    # reduce-scatter of the gradients, all-gather of the parameters; its 1/N of the parameters kept flat, beside the
    # model's whole ones (netmodel/memory.py)
    traits = replace(Bucketed.traits, family=REDUCE_SCATTER_FAMILY, shards=GRADIENTS_AND_STATE,
                     keeps_parameter_shard=True,
                     compressions=("none", "fp16", "bf16"),
                     no_compression_because="PowerSGD's factors are summed whole, not reduce-scattered",
                     lost_when_compiled="its buckets' reduce-scatters leave at the end of backward (a compiled "
                                        "backward hands over every gradient at its end), and every all-gather is "
                                        "waited for before forward's graph starts: neither hides behind compute")

    def __init__(self, bucket_mb: float = DEFAULT_BUCKET_MB, compressor=None, timeout_s: float | None = None):
        super().__init__(bucket_mb, compressor)
        self.timeout = None if timeout_s is None else timedelta(seconds=timeout_s)  # the ring's group's (Gloo)
        self.rings: RingReduceScatters | None = None  # Gloo: the reduce-scatters, a ring of our own on a thread
        self.shard_params: list[torch.Tensor] = []  # per bucket, this rank's slice of its parameters
        self.received: dict[int, tuple] = {}  # bucket index -> its reduce-scatter's output and message, in flight
        self.gathering: dict[int, tuple] = {}  # bucket index -> its all-gather's output and future, in flight

    @classmethod
    def _from_config(cls, config) -> Zero:
        return cls(config.bucket_size_mb, compressor_for(cls, config), config.timeout)

    def wrap(self, model: nn.Module) -> nn.Module:
        super().wrap(model)
        if dist.get_backend() == "gloo" and dist.get_world_size() > 1:  # collective: the ring's own group
            self.rings = RingReduceScatters(self.timeout)
        self.arrivals = None  # no order to learn: the shards, and so the buckets, must exist before the first step
        self.build(backward_order(len(self.params)))
        self.shard_params = [self.slice_of(bucket) for bucket in self.buckets]
        bucket_of = {id(param): self.slot[index][0].index for index, param in enumerate(self.params)}
        for module in model.modules():
            held = sorted({bucket_of[id(p)] for p in module.parameters(recurse=False) if id(p) in bucket_of})
            if held:
                module.register_forward_pre_hook(lambda _module, _inputs, held=held: self.arrive(held))
        return model

    def slice_of(self, bucket: Bucket) -> torch.Tensor:
        """A copy of this rank's slice of `bucket`'s parameters (zeros where it is padded)."""
        start, end = shard_bounds(sum(p.numel() for p in bucket.params), dist.get_world_size(), dist.get_rank())
        for view, param in zip(bucket.buffer.views, bucket.params):  # the padded buffer holds parameters this once
            view.copy_(param.detach())
        values = bucket.buffer.data[start:end].clone()
        bucket.release()
        return values

    def _load_model_state(self, model: nn.Module, state: dict) -> None:
        """The checkpoint's weights, and this rank's slices of them, which the optimizer steps (in place: it holds
        them)."""
        super()._load_model_state(model, state)
        for bucket, shard in zip(self.buckets, self.shard_params):
            shard.copy_(self.slice_of(bucket))

    def new_bucket(self, index: int, params: list[nn.Parameter]) -> Bucket:
        return Bucket(index, params, multiple_of=dist.get_world_size())

    def make_optimizer(self, model: nn.Module, build: Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
                       ) -> torch.optim.Optimizer:
        return build(self.shard_params)

    def launch(self, bucket: Bucket) -> None:
        """Start the reduce-scatter of `bucket`: this rank receives the sum of its slice, in the wire's type."""
        data, world = bucket.buffer.data, dist.get_world_size()
        message = data if self.traits.wire_dtype is None else coded(  # a share each
            self._recorder, lambda: torch.div(data, world).to(self.traits.wire_dtype), bucket=bucket.index)
        received = torch.empty(data.numel() // world, dtype=message.dtype, device=data.device)
        noted = self._recorder.message(REDUCE_SCATTER, now(), None, message.numel() * message.element_size(),
                                      bucket.index)
        if self.rings is not None:  # Gloo: a ring of our own, half the bytes of Gloo's (RingReduceScatters); it sums
            # into the bucket's buffer, dropped once it is done, and its thread notes the message's end
            bucket.work = self.rings.start(received, message, lambda: self._recorder.ended(noted))
        else:  # another backend's own: its message ends where the sync waits for it
            bucket.work = reduce_scatter_single(received, message, op=dist.ReduceOp.SUM, async_op=True)
        self.received[bucket.index] = (received, noted)
        self.next_to_launch = bucket.index + 1

    def reduce_scattered(self) -> None:
        """Launch what backward did not, wait for every reduce-scatter: each slice's mean gradient is its .grad."""
        for bucket in self.buckets[self.next_to_launch:]:  # not launched in backward: unused parameters
            bucket.buffer.pack()
            self.launch(bucket)
        world = dist.get_world_size()
        for bucket, shard in zip(self.buckets, self.shard_params):
            bucket.work.wait()
            received, noted = self.received.pop(bucket.index)
            if self.rings is None:  # (the ring's thread noted its end)
                self._recorder.ended(noted)
            narrowed = self.traits.wire_dtype is not None
            mean = (coded(self._recorder, received.to, shard.dtype, bucket=bucket.index) if narrowed
                    else received.div_(world))
            shard.grad = mean
            bucket.work, bucket.waiting = None, len(bucket.params)
            bucket.release()
        for param in self.params:
            param.grad = None  # in its slice's mean now: the full gradient is not kept
        self.next_to_launch = 0

    def after_step(self, model: nn.Module) -> Synced:
        """Start the all-gather of every bucket's updated slices, in forward order (the last bucket holds the first
        layers); the next forward takes each in as it needs it (`arrive`)."""
        self.settle()
        for bucket, shard in reversed(list(zip(self.buckets, self.shard_params))):
            whole = torch.empty(shard.numel() * dist.get_world_size(), dtype=shard.dtype, device=shard.device)
            start = now()
            work = all_gather_single(whole, shard, async_op=True)
            noted = self._recorder.message(ALL_GATHER, start, None, whole.numel() * whole.element_size(), bucket.index)
            # its end noted as the backend finishes it, not when the next forward comes to wait for it (mostly later)
            self.gathering[bucket.index] = (whole, self._recorder.after(noted, work.get_future()))
        return GATHERED

    def arrive(self, indices: Iterable[int]) -> None:
        """Wait for these buckets' all-gathers, if still pending, and copy the parameters they bring in."""
        for index in indices:
            pending = self.gathering.pop(index, None)
            if pending is None:
                continue
            whole, done = pending
            done.wait()
            params = self.buckets[index].params
            with torch.no_grad():
                for param, piece in zip(params, pieces(whole, params)):
                    param.copy_(piece)

    def settle(self) -> None:
        """Every pending all-gather in: the parameters are the step's, on every rank."""
        self.arrive(sorted(self.gathering, reverse=True))

    def sync(self, model: nn.Module) -> None:
        self.settle()  # a bucket no forward reached (parameters unused this step) is taken in here
        self.reduce_scattered()

    def _replicated(self, model: nn.Module) -> list[torch.Tensor]:
        self.settle()
        return super()._replicated(model)

    def _whole_parameters(self, model: nn.Module) -> list[torch.Tensor]:
        self.settle()
        return super()._whole_parameters(model)

    def _model_state(self, model: nn.Module) -> dict | None:
        self.settle()
        return super()._model_state(model)

    @contextlib.contextmanager
    def evaluated(self, model: nn.Module):
        self.settle()
        yield

    def _held(self) -> dict[str, list[torch.Tensor]]:
        return {"parameters": list(self.shard_params),
                "gradients": [shard.grad for shard in self.shard_params if shard.grad is not None]
                + [bucket.held.data for bucket in self.buckets if bucket.held is not None]}

    # -- checkpoints: the optimizer state as one optimizer over the whole model holds it ------------------------------

    def _optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> dict:
        """Collective: each shard's state tensors all-gathered and cut back into one per parameter, keyed by the
        parameter's index in model.parameters() (an unsharded optimizer's state_dict: SGD's momentum buffers, AdamW's
        moments, and its step count, a number that each parameter of the bucket takes)."""
        sharded = optimizer.state_dict()
        index_of = {id(p): i for i, p in enumerate(model.parameters())}
        state: dict[int, dict] = {}
        for number, (bucket, shard) in enumerate(zip(self.buckets, self.shard_params)):
            for key, value in sharded["state"].get(number, {}).items():
                if torch.is_tensor(value) and value.dim() == 0:  # AdamW's step count: every parameter's
                    for param in bucket.params:
                        state.setdefault(index_of[id(param)], {})[key] = value.clone()
                    continue
                if not (torch.is_tensor(value) and value.shape == shard.shape):
                    continue
                whole = torch.empty(shard.numel() * dist.get_world_size(), dtype=value.dtype, device=value.device)
                all_gather_single(whole, value.contiguous())
                for param, piece in zip(bucket.params, pieces(whole, bucket.params)):
                    state.setdefault(index_of[id(param)], {})[key] = piece.cpu().clone()
        groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": list(range(len(index_of)))}
                  for group in sharded["param_groups"]]
        return {"state": state, "param_groups": groups}

    def _load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict, model: nn.Module) -> None:
        """This rank's slice of each bucket's state, from the state of an optimizer over the whole model."""
        params = list(model.parameters())
        index_of = {id(p): i for i, p in enumerate(params)}
        world, rank = dist.get_world_size(), dist.get_rank()
        whole_state = {int(k): v for k, v in state["state"].items()}
        sharded: dict[int, dict] = {}
        for number, (bucket, shard) in enumerate(zip(self.buckets, self.shard_params)):
            held = [whole_state.get(index_of[id(p)], {}) for p in bucket.params]
            keys = dict.fromkeys(key for entry in held for key, value in entry.items() if torch.is_tensor(value))
            start, end = shard_bounds(shard.numel() * world, world, rank)
            for key in keys:
                counts = [entry[key] for entry in held if key in entry and entry[key].dim() == 0]
                if counts:  # AdamW's step count, the same for the bucket's parameters
                    sharded.setdefault(number, {})[key] = counts[0].clone()
                    continue
                flat = torch.zeros(shard.numel() * world, dtype=shard.dtype)
                for entry, piece in zip(held, pieces(flat, bucket.params)):
                    if key in entry:
                        piece.copy_(entry[key].reshape(piece.shape))
                sharded.setdefault(number, {})[key] = flat[start:end].to(shard.device).clone()
        groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": list(range(len(self.shard_params)))}
                  for group in state["param_groups"]]
        optimizer.load_state_dict({"state": sharded, "param_groups": groups})
