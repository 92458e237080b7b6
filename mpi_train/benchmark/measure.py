"""The timed steps: every contender's forward, backward and sync, round robin between barriers, and what the
per-rank times say when each step's slowest rank is taken."""

from __future__ import annotations

import contextlib
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import netmodel
from ..clock import Clock
from ..step.precision import PRECISIONS
from .clocks import BackwardClock, CodecClock
from .contenders import NO_SYNC, Contender


def measure(entries: list[Contender], images: torch.Tensor, labels: torch.Tensor, steps: int, warmup: int,
            device: torch.device, progress,
            precision: str = "32-true") -> tuple[dict[str, dict[str, list[float]]], tuple[int, ...] | None]:
    """Per method, this rank's compute (and its backward), sync and whole-step seconds for each timed step, methods
    interleaved round-robin, and when the no-sync baseline's gradients became ready during its backward (its
    "ready": pooled_backward makes every rank's one profile), with the order they came in. A step runs from one
    barrier to the next, so its time is the slowest rank's on every rank. Forward and loss run under autocast to
    `precision`'s dtype (a resolved --precision), as the job's step runs them."""
    now = Clock(device)
    computing = PRECISIONS[precision]
    times = {entry.name: {"compute": [], "backward": [], "sync": [], "step": []} for entry in entries}
    codecs = {}
    for entry in entries:  # DDP's compression runs in torch's hooks, out of sight
        if entry.method.compressor.name != "none" and not entry.method.traits.inside_ddp():
            codecs[entry.name] = CodecClock()
            entry.method.record_into(codecs[entry.name])
            # after backward (in all, and each interval in the order sync() ran them), and inside backward
            times[entry.name].update(codec=[], codec_intervals=[], codec_backward=[])
    clock = BackwardClock(entries[0].model, now)  # the no-sync baseline: nothing else runs in its backward
    total = warmup + steps
    with contextlib.ExitStack() as explained:  # a method's own failure that the model causes, said as the job says it
        for entry in entries:
            explained.enter_context(entry.method.explaining())
        for step in range(total):
            shift = step % len(entries)
            for entry in entries[shift:] + entries[:shift]:  # a different method goes first each step
                dist.barrier()
                t0 = now()
                entry.model.zero_grad(set_to_none=True)
                with computing.autocast(device):
                    loss = F.cross_entropy(entry.net(images), labels)
                forward_end = now()
                loss.backward()
                t1 = now()
                in_backward = codecs[entry.name].take()[0] if entry.name in codecs else 0.0
                if entry.name == NO_SYNC and step >= warmup:
                    clock.record(forward_end, t1)
                if not entry.overlapped:  # (a barrier would also wait for an overlapped method's sends in flight)
                    dist.barrier()  # sync starts with every rank ready, so lateness is not counted as sync
                t2 = now()
                entry.method.sync(entry.model)
                entry.method.after_step(entry.model)  # (a model-averaging method averages here: no optimizer step)
                dist.barrier()
                t3 = now()
                if step >= warmup:
                    times[entry.name]["compute"].append(t1 - t0)
                    times[entry.name]["backward"].append(t1 - forward_end)
                    times[entry.name]["sync"].append(t3 - t2)
                    times[entry.name]["step"].append(t3 - t0)
                if entry.name in codecs:
                    codec_s, intervals = codecs[entry.name].take()
                    if step >= warmup:
                        times[entry.name]["codec"].append(codec_s)
                        times[entry.name]["codec_backward"].append(in_backward)
                        times[entry.name]["codec_intervals"].append(intervals)
            progress(step + 1, total, step < warmup)
    times[NO_SYNC]["ready"] = clock.shares  # (every rank's, pooled by pooled_backward)
    return times, clock.order


def pooled_backward(per_rank: list[dict], order: tuple[int, ...] | None) -> netmodel.Backward:
    """The backward profile over every rank's timed no-sync steps (measure() keeps each rank's under "ready"): the
    median share per gradient and backward's median share of compute. With ranks sharing cores one rank's few
    steps are not enough: between two benches rank 0 alone put VGG-11's first 27 MB bucket ready at 85% and at 91%
    of backward, and zero's predicted wire time at 1 Gbit/s moved threefold with it."""
    baseline = [rank[NO_SYNC] for rank in per_rank]
    steps = [shares for rank in baseline for shares in rank.get("ready", [])]
    fractions = [b / c for rank in baseline for b, c in zip(rank["backward"], rank["compute"]) if c > 0]
    if not steps or not fractions:
        return netmodel.ASSUMED_BACKWARD
    return netmodel.Backward(statistics.median(fractions), tuple(statistics.median(column) for column in zip(*steps)),
                             order)


def last_to_finish_backward(per_rank: list[dict], name: str) -> list[int]:
    """Each timed step's rank whose forward and backward of method `name` took longest: every rank starts the step
    at the same barrier, so it is the last to finish backward."""
    return [max(range(len(per_rank)), key=computes.__getitem__)
            for computes in zip(*(rank[name]["compute"] for rank in per_rank))]


def after_last_backward(per_rank: list[dict], name: str) -> list[float]:
    """Each timed step's sync seconds of method `name` on the rank that finished backward last: the communication
    its backward did not hide, with no wait for a later rank in it. For an overlapped method this is the exposed
    communication measured within one step, not as the difference of two steps' times, whose noise on shared
    cores (±50 to ±300 ms on a 2 s step) can exceed a compressed method's whole sync."""
    return [per_rank[rank][name]["sync"][step] for step, rank in enumerate(last_to_finish_backward(per_rank, name))]


def codec_after_backward(per_rank: list[dict], name: str) -> list[float] | None:
    """Each of method `name`'s codec intervals after backward, in the order its sync() ran them: in each step the
    slowest rank's (each sum that follows waits for every rank's work), then the median over steps; None where
    ranks or steps ran different numbers of them."""
    steps = [list(ranks) for ranks in zip(*(rank[name]["codec_intervals"] for rank in per_rank))]
    if not steps or len({len(intervals) for ranks in steps for intervals in ranks}) != 1:
        return None
    slowest_each = [[max(column) for column in zip(*ranks)] for ranks in steps]
    return [statistics.median(column) for column in zip(*slowest_each)]


def spread(values: list[float]) -> float:
    """Half the interquartile range: how far a typical step's figure strays from the median on this machine."""
    if len(values) < 4:
        return float("nan")
    quartiles = statistics.quantiles(values, n=4)
    return (quartiles[2] - quartiles[0]) / 2


def slowest(per_rank: list[dict], name: str, phase: str) -> list[float]:
    """Each timed step's `phase` seconds of method `name` on the rank that took longest in it."""
    return [max(values) for values in zip(*(rank[name][phase] for rank in per_rank))]
