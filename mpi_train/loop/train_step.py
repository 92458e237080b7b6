"""One optimizer step on a rank: data, forward and backward, sync, optimizer step, each phase's boundaries marked on
the step's clock."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..clock import StepClock
from ..sync import Synced
from .job import Job

StepTimes = tuple[int, dict]  # (step, its phase times in seconds)


@dataclass(frozen=True)
class Computed:
    """The step's loss (the mean over its micro-batches) and the clock's marks up to its sync."""

    loss: torch.Tensor
    loads: list[tuple[int, int]]  # each micro-batch's marks before and after loading it
    forward_end: int


def train_step(job: Job, batches, clock: StepClock, step: int, rank: int,
               accumulate: int = 1) -> tuple[torch.Tensor, float, list[StepTimes], Synced] | None:
    """Data, forward and backward (of `accumulate` micro-batches, their gradients added up, nothing sent before the
    last), sync, optimizer step; the loss, the step's learning rate, the phase times of the steps the clock has
    read so far, (step, times) each: this one on CPUs, the one before on a GPU, and what the step synchronised
    (None: the epoch is over). The clock marks the phases' boundaries (forward apart from backward only in a
    timeline); with micro-batches, data time is their loading and compute the rest up to the sync."""
    job.recorder.begin(step)
    job.overflow.at(rank, step)
    begun = clock.start()
    job.optimizer.zero_grad(set_to_none=True)
    computed = forward_backward(job, batches, clock, begun, rank, accumulate)
    if computed is None:
        return None
    backward_end = clock.mark()
    job.method.sync(job.model)
    synced = clock.mark()
    # unscaled and clipped; an overflow on any rank skips the update on every rank
    ready = job.gradients.ready()
    if ready:
        job.optimizer.step()
    stepped = clock.mark()
    # a model-averaging method's average, when due: its sync region, after the optimizer's
    reported = job.method.after_step(job.model)
    averaged = reported.averaged
    ended = clock.mark() if averaged else stepped
    record = job.recorder.current

    def phases(at: list[float]) -> StepTimes:
        # the phases as one step's, the micro-batches' loading first
        t0 = at[begun]
        t1 = t0 + sum(at[loaded] - at[loading] for loading, loaded in computed.loads)
        t2, t3, t4, t5 = at[backward_end], at[synced], at[stepped], at[ended]
        job.recorder.end((t0, t1, at[computed.forward_end], t2, t3, t4, t5), sync=(t4, t5) if averaged else (t2, t3),
                         step=record)
        return step, {"data_time_s": t1 - t0, "compute_time_s": t2 - t1, "sync_time_s": (t3 - t2) + (t5 - t4),
                      "optimizer_time_s": t4 - t3, "step_time_s": t5 - t0}

    read = clock.close(phases)
    lr = job.learning_rate.current
    job.learning_rate.step()
    return computed.loss, lr, read, reported


def forward_backward(job: Job, batches, clock: StepClock, begun: int, rank: int, accumulate: int) -> Computed | None:
    """Each micro-batch's loading, forward and backward, the sync method holding back its messages before the last;
    None when the epoch has no batch left."""
    loads, loss = [], 0.0
    for micro in range(accumulate):
        # zero_grad queued nothing: the first micro-batch's loading starts at the step's first mark
        loading = clock.mark() if micro else begun
        batch = next(batches, None)
        if batch is None:
            return None
        images, labels = batch[0].to(job.device, non_blocking=True), batch[1].to(job.device, non_blocking=True)
        loads.append((loading, clock.mark()))
        last = micro == accumulate - 1
        with contextlib.nullcontext() if last else job.method.accumulating(job.net):
            # forward and loss under autocast; backward outside it, as torch advises
            with job.precision.autocast(job.device):
                micro_loss = F.cross_entropy(job.net(images).float(), labels)
            # a simulated straggler computes longer, before its last gradients are ready
            if last:
                job.slow.at(rank)
            forward_end = clock.mark() if job.recorder.detailed else loads[-1][1]
            job.gradients.scaled(micro_loss / accumulate if accumulate > 1 else micro_loss).backward()
        loss = loss + micro_loss.detach() / accumulate if accumulate > 1 else micro_loss
    return Computed(loss=loss, loads=loads, forward_end=forward_end)
