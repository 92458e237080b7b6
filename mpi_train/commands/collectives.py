"""Cluster check: every collective the sync methods use, against its closed form, plus what each costs.

    mpirun -np 4 --hostfile hostfile python -m mpi_train collectives

Rank r contributes the tensor (r + 1) * ones(n), so every result is known in advance:
all_reduce(SUM) gives N(N+1)/2 everywhere, gather/all_gather give [1, 2, ..., N], and so on.
It is the first thing to run on a new cluster: it exercises the same rendezvous and
process group as training, and exits non-zero if any rank got a wrong answer.

Then it times an allreduce of one buffer beside the reduce-scatter and all-gather the sharded
methods (zero, fsdp) use in its place: a ring allreduce is exactly those two, so a bandwidth-optimal
backend (NCCL) does them in an allreduce's time, and one that does not (Gloo over TCP, see
docs/results.md) shows it in their ratio.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ..cluster import Cluster
from ..config import BACKENDS, LAUNCHERS, check_timeout
from ..devices import resolve_backend
from ..errors import UserError
from ..rankguard import RankAwareParser, guarded, join_job
from ..sync.zero import all_gather_single, reduce_scatter_single

CHECK_ELEMENTS = 1024
MAX_SIZE_MB = 1e6  # a TiB, beyond any device's memory


def _contribution(rank: int, device: torch.device, n: int = CHECK_ELEMENTS) -> torch.Tensor:
    return torch.full((n,), float(rank + 1), device=device)


def _close(tensor: torch.Tensor, value: float) -> bool:
    return bool(torch.all(tensor == value))


def _all_reduce(rank, world, device):
    t = _contribution(rank, device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return _close(t, world * (world + 1) / 2)


def _reduce(rank, world, device):
    t = _contribution(rank, device)
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
    return rank != 0 or _close(t, world * (world + 1) / 2)


def _broadcast(rank, world, device):
    t = _contribution(rank, device) * 7  # rank 0 holds 7s; everyone must end with them
    dist.broadcast(t, src=0)
    return _close(t, 7.0)


def _all_gather(rank, world, device):
    parts = [torch.empty(CHECK_ELEMENTS, device=device) for _ in range(world)]
    dist.all_gather(parts, _contribution(rank, device))
    return all(_close(part, i + 1) for i, part in enumerate(parts))


def _gather(rank, world, device):
    parts = [torch.empty(CHECK_ELEMENTS, device=device) for _ in range(world)] if rank == 0 else None
    dist.gather(_contribution(rank, device), gather_list=parts, dst=0)
    return rank != 0 or all(_close(part, i + 1) for i, part in enumerate(parts))


def _scatter(rank, world, device):
    received = torch.empty(CHECK_ELEMENTS, device=device)
    parts = [_contribution(i, device) * 10 for i in range(world)] if rank == 0 else None
    dist.scatter(received, scatter_list=parts, src=0)
    return _close(received, 10.0 * (rank + 1))


def _reduce_scatter_tensor(rank, world, device):
    chunks = torch.cat([_contribution(rank, device) * (i + 1) for i in range(world)])  # chunk i holds (rank+1)(i+1)
    received = torch.empty(CHECK_ELEMENTS, device=device)
    reduce_scatter_single(received, chunks)
    return _close(received, (rank + 1) * world * (world + 1) / 2)


def _all_gather_into_tensor(rank, world, device):
    whole = torch.empty(world * CHECK_ELEMENTS, device=device)
    all_gather_single(whole, _contribution(rank, device))
    return all(_close(part, i + 1) for i, part in enumerate(whole.chunk(world)))


CHECKS: dict[str, Callable[[int, int, torch.device], bool]] = {
    "reduce": _reduce, "all_reduce": _all_reduce, "scatter": _scatter,
    "gather": _gather, "all_gather": _all_gather, "broadcast": _broadcast,
    "reduce_scatter": _reduce_scatter_tensor, "all_gather_t": _all_gather_into_tensor,
}


def run_checks(rank: int, world: int, device: torch.device) -> dict[str, bool]:
    """Run every collective once; True where this rank saw the closed-form result."""
    return {name: check(rank, world, device) for name, check in CHECKS.items()}


def timed(collective: Callable[[], None], device: torch.device, iters: int) -> float:
    """Seconds per call of `collective`, after one untimed call (connections, buffers), on every rank together."""
    collective()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        collective()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters


def allreduce_bandwidth(world: int, device: torch.device, megabytes: float, iters: int) -> dict:
    """Time all_reduce of one float32 buffer (bus bandwidth = algbw * 2(N-1)/N, as nccl-tests report it), and the
    reduce-scatter and all-gather of the same buffer that stand for it in the sharded methods."""
    tensor = torch.ones(int(megabytes * 2**20 // 4 // world * world), device=device)
    shard = torch.empty(tensor.numel() // world, device=device)
    seconds, size = timed(lambda: dist.all_reduce(tensor), device, iters), tensor.numel() * 4
    algbw = size / seconds
    return {"bytes": size, "seconds": seconds, "algbw_gb_s": algbw / 1e9,
            "busbw_gb_s": algbw * 2 * (world - 1) / world / 1e9,
            "reduce_scatter_s": timed(lambda: reduce_scatter_single(shard, tensor), device, iters),
            "all_gather_s": timed(lambda: all_gather_single(tensor, shard), device, iters)}


def format_table(rows: list[dict], hosts: Sequence[str]) -> str:
    width = max(len(name) for name in CHECKS) + 2
    lines = [f"{'rank':>4}  {'host':<16}" + "".join(f"{name:>{width}}" for name in CHECKS)]
    for rank, results in enumerate(rows):
        lines.append(f"{rank:>4}  {hosts[rank]:<16}"
                     + "".join(f"{'ok' if results[n] else 'WRONG':>{width}}" for n in CHECKS))
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None, quiet: bool) -> argparse.Namespace:
    parser = RankAwareParser(prog="python -m mpi_train collectives", quiet=quiet,
                             description="Check every collective against its closed form, measure allreduce "
                                         "bandwidth and time reduce-scatter plus all-gather against it.")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="auto",
                        help="what started the ranks (default: auto, detected)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="process-group backend (default: auto)")
    parser.add_argument("--size-mb", type=float, default=16.0,
                        help="buffer for the timed collectives, MiB (default: 16)")
    parser.add_argument("--iters", type=int, default=10, help="timed repetitions of each (default: 10)")
    parser.add_argument("--master-addr", default=None, help="rendezvous address (default: $MASTER_ADDR, else chosen)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may wait (default: 60)")
    return parser.parse_args(argv)


def check_numbers(args: argparse.Namespace) -> None:
    """The flags' numbers, refused before any collective (-1 MiB, or 0 timed repetitions, means nothing)."""
    if not 0 < args.size_mb <= MAX_SIZE_MB:
        raise UserError(f"--size-mb must be above 0 and up to {MAX_SIZE_MB:g} MiB, got {args.size_mb:g}.")
    if args.iters < 1:
        raise UserError(f"--iters is how many times each collective is timed, at least 1; got {args.iters}.")
    check_timeout(args.timeout)


def check(cluster: Cluster, args: argparse.Namespace) -> None:
    """Run the checks on every rank; rank 0 prints the table. Wrong results raise on every rank."""
    info = cluster.info
    check_numbers(args)
    backend, device_name = resolve_backend(cluster, args.backend)
    device = torch.device(device_name)
    address = cluster.open_process_group(backend, args.master_addr, args.timeout, device)
    results = run_checks(info.rank, info.world_size, device)
    bandwidth = allreduce_bandwidth(info.world_size, device, args.size_mb, args.iters)
    rows = cluster.gather(results)
    dist.destroy_process_group()
    failed = None
    if info.is_main:
        failed = [(rank, name) for rank, row in enumerate(rows) for name, ok in row.items() if not ok]
        print(f"collectives check: {info.world_size} rank(s), backend {backend}, rendezvous {address}")
        print(format_table(rows, cluster.hosts))
        print(f"all_reduce {bandwidth['bytes'] / 2**20:.0f} MiB: {bandwidth['seconds'] * 1e3:.2f} ms, "
              f"algbw {bandwidth['algbw_gb_s']:.2f} GB/s, busbw {bandwidth['busbw_gb_s']:.2f} GB/s")
        both = bandwidth["reduce_scatter_s"] + bandwidth["all_gather_s"]
        print(f"reduce_scatter {bandwidth['reduce_scatter_s'] * 1e3:.2f} ms + all_gather "
              f"{bandwidth['all_gather_s'] * 1e3:.2f} ms of the same buffer: {both / bandwidth['seconds']:.2f}x the "
              f"all_reduce (a bandwidth-optimal backend: 1.00x; zero and fsdp pay the ratio)")
    failed = cluster.bcast(failed)
    if failed:
        raise UserError(
            f"collectives returned wrong results (rank, operation): {failed}. The process group "
            f"is not trustworthy on this cluster: check that every host runs the same torch and MPI "
            f"versions, and try --backend gloo to rule out the GPU transport."
        )
    if info.is_main:
        print("all collectives correct")


def main(argv: Sequence[str] | None = None) -> int:
    cluster = join_job(argv)
    args = _parse(argv, quiet=not cluster.info.is_main)
    return guarded(cluster, lambda: check(cluster, args), memory_fix="lower --size-mb")
