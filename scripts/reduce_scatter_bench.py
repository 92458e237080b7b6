"""Gloo's reduce_scatter_single against two ways of our own to the same result, on every rank of an mpirun job.

    mpirun -np 4 python scripts/reduce_scatter_bench.py --size-mb 32 --iters 5

Each rank ends with the sum over ranks of its 1/N of one float32 buffer (what `zero` needs
from each bucket), got three ways: torch's `reduce_scatter_single` (Gloo's), a ring
reduce-scatter over point-to-point messages (N-1 steps of S/N each way: (N-1)/N·S per
rank, the bytes a bandwidth-optimal backend moves; the exchange of sync/ring.py), and an
allreduce of the whole buffer then a slice (2(N-1)/N·S). An allreduce and an all-gather of
the same buffer are timed beside them. Every result is checked against the closed form
first. Medians of the slowest rank's seconds; rank 0 prints them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from mpi_train.cluster import Cluster, GroupChannel
from mpi_train.sync.ring import Ring
from mpi_train.sync.zero import all_gather_single, reduce_scatter_single


def ring_reduce_scatter(whole: torch.Tensor, shard: torch.Tensor, incoming: torch.Tensor) -> None:
    """Rank r ends with the sum of chunk r: at step s it sends its running sum of chunk (r-s-1) to the right and adds
    what comes from the left into chunk (r-s-2); after N-1 steps chunk r is complete. `whole` is summed into."""
    world, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % world, (rank - 1) % world
    chunks = whole.chunk(world)
    for step in range(world - 1):
        send, receive = chunks[(rank - step - 1) % world], chunks[(rank - step - 2) % world]
        Ring.exchange(send, incoming, right, left)
        receive.add_(incoming)
    shard.copy_(chunks[rank])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=float, default=32.0, help="buffer, MiB (default: 32)")
    parser.add_argument("--iters", type=int, default=5, help="timed repetitions of each (default: 5)")
    args = parser.parse_args()
    cluster = Cluster.from_mpi()
    cluster.open_process_group("gloo", None, 300)
    world, rank = dist.get_world_size(), dist.get_rank()
    numel = int(args.size_mb * 2**20 // 4 // world * world)
    source = torch.arange(numel, dtype=torch.float32) % 1000 * (rank + 1)  # exact in float32 when summed
    whole, shard, incoming = source.clone(), torch.empty(numel // world), torch.empty(numel // world)
    expected = (torch.arange(numel, dtype=torch.float32) % 1000 * (world * (world + 1) / 2)).chunk(world)[rank]

    def gloo_rs():
        reduce_scatter_single(shard, whole)

    def ours():
        whole.copy_(source)  # summed in place: each call starts from the rank's own buffer
        ring_reduce_scatter(whole, shard, incoming)

    def allreduce_slice():
        whole.copy_(source)
        dist.all_reduce(whole)
        shard.copy_(whole.chunk(world)[rank])

    def allreduce():
        dist.all_reduce(whole)

    def all_gather():
        all_gather_single(whole, shard)

    ways = {"reduce_scatter_single (gloo)": gloo_rs, "ring reduce-scatter (ours, p2p)": ours,
            "allreduce, then slice": allreduce_slice, "all_reduce": allreduce, "all_gather_single": all_gather}
    for name in list(ways)[:3]:
        whole.copy_(source)
        ways[name]()
        if not torch.equal(shard, expected):
            raise SystemExit(f"rank {rank}: {name} gave a wrong shard")
    seconds = {}
    for name, way in ways.items():
        way()  # untimed: connections and buffers
        times = []
        for _ in range(args.iters):
            dist.barrier()
            started = time.perf_counter()
            way()
            times.append(time.perf_counter() - started)
        seconds[name] = times
    slowest = GroupChannel().allgather(seconds)
    dist.destroy_process_group()
    if rank == 0:
        medians = {name: statistics.median(max(r[name][i] for r in slowest) for i in range(args.iters))
                   for name in ways}
        gloo = medians["reduce_scatter_single (gloo)"]
        print(f"{world} ranks on {len(set(cluster.hosts))} host(s), {numel * 4 / 2**20:.0f} MiB float32, "
              f"median of {args.iters} (slowest rank), every result checked")
        for name, value in medians.items():
            print(f"  {name:<34}{value * 1e3:>10.1f} ms  {value / gloo:>5.2f}x gloo's reduce-scatter")


if __name__ == "__main__":
    main()
