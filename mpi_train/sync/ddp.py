"""ddp: PyTorch's DistributedDataParallel, which averages bucketed gradients during backward."""

from __future__ import annotations

import contextlib
import inspect
import re

import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from ..errors import UserError
from ..timeline import now
from .base import INSIDE_DDP, SyncMethod, compressor_for
from .compression import Compressor
from .messages import BUCKETS
from .traits import RING_ALLREDUCE, Traits


def buffers_synced(every_forward: bool) -> dict:
    """DDP's option to send rank 0's buffers at every forward, by the name this torch gives it."""
    newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    return {"forward_sync_buffers" if newer else "broadcast_buffers": every_forward}


# DistributedDataParallel's words when a parameter it waits for got no gradient in the step before
SKIPPED = "Expected to have finished reduction in the prior iteration"


class DDP(SyncMethod):
    """The reference: communication overlaps backward, so its cost shows in compute time, not sync time.

    Subclasses compress the way DDP users do, with one of torch's communication hooks
    (`comm_hook`), and name that compression as `fixed_compression`. Whichever hook runs is
    wrapped so that each bucket's message is noted (timeline.py): when it starts, when it ends.
    """

    traits = Traits(family=RING_ALLREDUCE, messages=BUCKETS, sends=INSIDE_DDP,  # DDP's buckets: 1 MB first, then 25 MB
                    no_compression_because="DistributedDataParallel compresses through torch's communication hooks: "
                                           "use --sync ddp_fp16 or --sync ddp_powersgd")

    def __init__(self, compressor: Compressor | None = None, find_unused: bool = False):
        super().__init__(compressor)
        # a model with parameters no logit depends on: DDP would wait at every step for gradients that never come
        self.find_unused = find_unused
        self._trained: list[str] = []  # the names of the parameters DDP numbers (those that require a gradient)
        self._wrapped: DistributedDataParallel | None = None

    @classmethod
    def _from_config(cls, config) -> DDP:
        return cls(compressor_for(cls, config), find_unused=bool(config.untrained_parameters))

    def wrap(self, model: nn.Module) -> nn.Module:
        """DDP as its users are told to run it: each gradient a view into its bucket (no copy into the bucket and
        back, each a kernel per tensor on a GPU). On CPUs every bucket's hook is noted; on a GPU plain DDP keeps its
        own allreduce in C++ and a compression hook runs bare: a Python hook costs the host about 1 ms a step there
        (VGG-11 on an H100: 7.1 ms without one, 8.0 ms with), where its clock only says when work was queued."""
        device = next(model.parameters()).device
        on_gpu = device.type == "cuda"
        self._trained = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
        # one rank has nobody to send its buffers to, yet DDP would still broadcast them at every forward: 0.84 ms
        # of host time in a 4.2 ms VGG-11 step on an H200 (scripts/gpu_step_overhead.py)
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if on_gpu else None,
                                          gradient_as_bucket_view=True, find_unused_parameters=self.find_unused,
                                          **buffers_synced(dist.get_world_size() > 1))
        self._wrapped = wrapped
        state, hook = self.comm_hook()
        if not on_gpu:
            wrapped.register_comm_hook(state, self.noting(hook))
        elif hook is not default_hooks.allreduce_hook:
            wrapped.register_comm_hook(state, hook)
        return wrapped

    @contextlib.contextmanager
    def explaining(self):
        """DDP's failure when a parameter the model used at its start got no gradient in a later step (a forward that
        skips a branch on some steps), said in one paragraph: its own text asks for a bug report."""
        try:
            yield
        except RuntimeError as error:
            if SKIPPED not in str(error):
                raise
            raise UserError(self._skipped(str(error)), collective=False) from None

    def _skipped(self, text: str) -> str:
        """The paragraph for DDP's SKIPPED failure, whose text numbers the parameters without a gradient."""
        found = re.search(r"did not receive grad for rank (\d+): ([\d ]+)", text)
        indices = [int(index) for index in found.group(2).split()] if found else []
        names = [self._trained[index] if index < len(self._trained) else f"#{index}" for index in indices]
        listed = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        which = f" ({listed} on rank {found.group(1)})" if found else ""
        return (f"parameters got no gradient in a step{which}, though the model's forward used every parameter when "
                f"the job started: the forward skips them on some steps (a branch the data or the step decides). "
                f"DistributedDataParallel (--sync ddp, ddp_fp16, ddp_powersgd, zero_torch) waits for every parameter's "
                f"gradient unless told at its start that some may never come. Train this model with --sync bucketed "
                f"(buckets sent during backward, as ddp sends them, a missing gradient counted as zeros) or --sync "
                f"allreduce, or make the forward use every parameter at every step.")

    def accumulating(self, net: nn.Module):
        """DDP's own way: no_sync() keeps a micro-batch's gradients local, to be added to the next backward's."""
        return net.no_sync()

    def comm_hook(self) -> tuple:
        """(state, hook) of the communication hook: plain DDP's is torch's allreduce of the bucket's mean."""
        return None, default_hooks.allreduce_hook

    def noting(self, hook):
        """`hook`, with each bucket noted as a message from its hook's call to its future's completion."""
        def noted_bucket(state, bucket):
            start = now()
            future = hook(state, bucket)
            buffer = bucket.buffer()
            wire = self.traits.wire_dtype.itemsize if self.traits.wire_dtype is not None else buffer.element_size()
            message = self._recorder.message("allreduce (DDP bucket)", start, None, buffer.numel() * wire,
                                            bucket.index())
            return self._recorder.after(message, future)
        return noted_bucket

    def sync(self, model: nn.Module) -> None:
        """Nothing left to do: the wrapper already averaged the gradients inside backward."""

    def finish(self, model: nn.Module) -> bool:
        """A last step whose forward skipped a parameter left its gradients unaveraged, which no later forward
        reveals: DDP's own check raises the failure explaining() says. Nothing is sent."""
        if self._wrapped is not None and not self.find_unused:
            try:
                self._wrapped._check_reducer_finalized()
            except RuntimeError as error:
                if SKIPPED in str(error):
                    raise
                # any other complaint of this private check is torch's own to make: the replica check follows
        return False
