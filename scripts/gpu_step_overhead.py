"""Where a training job's step goes beyond a bare loop's on one GPU: the bare loop free-running, waiting for the GPU
every step, and under DistributedDataParallel; then the job's own step (`train.train_step` and what follows each
step) under `--sync ddp`, `flat` and `allreduce`, as it is and with each of three older ways put back (the host
waiting for the GPU at every step's end; a Python hook on every gradient; DDP broadcasting one rank's buffers to
nobody at every forward); then where its host time goes (cProfile).

    python scripts/gpu_step_overhead.py [--model vgg11] [--batch-size 256] [--steps 60]   # one process, NCCL (Gloo)

Each figure is wall time per step over --steps steps after 10 untimed, measured one after another in one process.
Figures: docs/results.md ("What a GPU step costs against a bare loop").
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import os
import pstats
from contextlib import contextmanager
from unittest import mock

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mpi_train import tracking
from mpi_train.benchmark.gpu import bare_step, seconds_per_step
from mpi_train.checkpoint import Position
from mpi_train.clock import StepClock
from mpi_train.commands.train import parse_config
from mpi_train.config import TrainConfig
from mpi_train.rankguard import join_job
from mpi_train.reporter import SilentReporter
from mpi_train.sync.ddp import buffers_synced
from mpi_train.timeline import StepRecorder
from mpi_train.train import AfterStep, setup, train_step

WARM = 10


def wall_per_step(step, steps: int, device: torch.device, wait_each: bool = False) -> float:
    return seconds_per_step(step, device, WARM, steps, wait_each) * 1e3


def bare(workload: TrainConfig, batch: int, device: torch.device, ddp: bool = False, broadcast_buffers: bool = True):
    """The GPU check's bare loop, or the same under DDP as the job's ddp builds it."""
    def wrap(model: torch.nn.Module) -> torch.nn.Module:
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       gradient_as_bucket_view=True, **buffers_synced(broadcast_buffers))
    return bare_step(workload, batch, device, wrap if ddp else None)


@contextmanager
def as_before(piece: str):
    """The job with one of the round's changes to its step taken back (a diagnosis, not a mode of the tool)."""
    if piece == "waiting for the GPU every step":
        with mock.patch("mpi_train.train.StepClock", functools.partial(StepClock, lagged=False)):
            yield
    elif piece == "a hook on every gradient":
        made = StepRecorder.__init__
        with mock.patch.object(StepRecorder, "__init__", lambda self, *a, **k: made(self, *a, **{**k, "gpu": False})):
            yield
    elif piece == "DDP's buffers broadcast at every forward":
        with mock.patch("mpi_train.sync.ddp.buffers_synced", lambda _every_forward: buffers_synced(True)):
            yield
    else:
        yield


def job_loop(cluster, flags: list[str], steps: int, piece: str, batch: int):
    """The job's own loop: ms per step by the wall, ms per step by its clock, and a profile of 20 more steps."""
    config = parse_config(["--dataset", "synthetic", "--synthetic-size", str(64 * batch), "--no-tracking",
                           "--epochs", "1000", "--max-steps", str(WARM + steps), "--timing-warmup-steps", str(WARM),
                           *flags], quiet=True)
    with as_before(piece):
        job = setup(config, cluster)
        clock = StepClock(job.device)
        after = AfterStep(config, cluster, job, clock, SilentReporter(), tracking.NullTracker())
        state = {"step": 0, "batches": iter(job.train_loader)}

        def step() -> None:
            state["step"] += 1
            done = train_step(job, state["batches"], clock, state["step"], cluster.info.rank)
            if done is None:  # the epoch's end: the next one's first batch
                state["batches"] = iter(job.train_loader)
                done = train_step(job, state["batches"], clock, state["step"], cluster.info.rank)
            after(Position(1, state["step"], state["step"], 0.0, 0.0), *done)

        wall = wall_per_step(step, steps, job.device)
        after.drain()
        by_clock = after.after_warmup.means()["step_time_s"] * 1e3
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20):
            step()
        profiler.disable()
    dist.destroy_process_group()
    return wall, by_clock, profiler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vgg11")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    cluster = join_job([])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    workload = parse_config(["--model", args.model, "--dataset", "synthetic"], quiet=True)
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    torch.backends.cudnn.benchmark = device.type == "cuda"
    step = bare(workload, args.batch_size, device)
    print(f"{'bare loop, free-running':<64} {wall_per_step(step, args.steps, device):7.2f} ms/step", flush=True)
    print(f"{'bare loop, waiting for the GPU every step':<64} "
          f"{wall_per_step(step, args.steps, device, wait_each=True):7.2f} ms/step", flush=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29613")
    dist.init_process_group(backend, rank=0, world_size=1, **({"device_id": device} if backend == "nccl" else {}))
    step = bare(workload, args.batch_size, device, ddp=True)
    print(f"{'the bare loop under DistributedDataParallel, free-running':<64} "
          f"{wall_per_step(step, args.steps, device):7.2f} ms/step", flush=True)
    step = bare(workload, args.batch_size, device, ddp=True, broadcast_buffers=False)
    print(f"{'the same without broadcasting buffers every forward':<64} "
          f"{wall_per_step(step, args.steps, device):7.2f} ms/step", flush=True)
    dist.destroy_process_group()
    flags = ["--model", args.model, "--batch-size", str(args.batch_size), "--backend", backend]
    profiles = {}
    for sync in ("ddp", "flat", "allreduce"):
        for piece in ("", "waiting for the GPU every step", "a hook on every gradient",
                      "DDP's buffers broadcast at every forward"):
            if sync != "ddp" and piece:
                continue
            wall, by_clock, profiles[(sync, piece)] = job_loop(cluster, [*flags, "--sync", sync], args.steps, piece,
                                                           args.batch_size)
            name = f"job --sync {sync}" + (f", with {piece}" if piece else "")
            print(f"{name:<64} {wall:7.2f} ms/step (its clock: {by_clock:.2f})", flush=True)
    out = io.StringIO()
    stats = pstats.Stats(profiles[("ddp", "")], stream=out)
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(r"mpi_train|parallel/distributed|optim/", 30)
    print("job --sync ddp, 20 steps under cProfile, by own time:\n" + out.getvalue(), flush=True)


if __name__ == "__main__":
    main()
