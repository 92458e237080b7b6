"""The links and collectives a benchmark prices the methods with: ping-pong within and between hosts, and each
collective over all ranks, fitted to alpha + beta·m over message sizes from 1 KB up."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from .. import netmodel
from ..advice import cache
from ..cluster import Cluster, GroupChannel
from ..netmodel.families import bus_bandwidth
from ..sync.ring import ring_reduce_scatter
from ..sync.zero import all_gather_single, reduce_scatter_single

ALLREDUCE_FIT = netmodel.ALLREDUCE  # the calibration's fit of torch's all_reduce (a bench JSON key, not a method)
# every collective the calibration fits, each under its own key (the sharded families price theirs from these; zero's
# own ring reduce-scatter on Gloo only, where zero runs it: sync/zero.py), called on a whole buffer and this rank's 1/N
CALIBRATED_COLLECTIVES = {
    ALLREDUCE_FIT: lambda whole, shard: dist.all_reduce(whole),
    netmodel.REDUCE_SCATTER: lambda whole, shard: reduce_scatter_single(shard, whole),
    netmodel.ALL_GATHER: lambda whole, shard: all_gather_single(whole, shard),
    netmodel.RING_REDUCE_SCATTER: lambda whole, shard: ring_reduce_scatter(whole, shard),
}
CALIBRATION_BYTES = 16 * 2**20  # the advisor's largest ping-pong message: enough to fit beta; larger only take longer


def collective_calibration(collective: str, largest: int, iters: int, device: torch.device) -> dict:
    """One collective over all ranks for buffers of 1 KB .. `largest` bytes, fitted to alpha + beta·m with m the
    whole buffer (what an allreduce sums, a reduce-scatter reads, an all-gather fills): the collective as the methods
    meet it on this backend (its beta folds in the bytes each rank moves and the reductions). Collective; every rank
    gets the fit, of the slowest rank's times."""
    world, run = dist.get_world_size(), CALIBRATED_COLLECTIVES[collective]
    sizes, seconds = [], []
    for size in netmodel.calibration_sizes(largest):
        whole = torch.zeros(max(world, size // 4 // world * world), device=device)
        shard = torch.zeros(whole.numel() // world, device=device)
        times = []
        for i in range(iters + 1):
            dist.barrier()
            started = time.perf_counter()
            run(whole, shard)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - started)
        sizes.append(whole.numel() * whole.element_size())
        seconds.append(statistics.median(times))
    slowest = GroupChannel().allgather(seconds)
    seconds = [max(column) for column in zip(*slowest)]
    fit = netmodel.Link.fit(sizes, seconds, source=collective)
    return {"alpha": fit.alpha, "beta": fit.beta, "fit_error": fit.fit_error, "sizes": sizes, "seconds": seconds}



def bench_links(cluster: Cluster, largest: int, iters: int, device: torch.device, link_rate: str | None,
                backend: str) -> tuple[dict | None, dict]:
    """The bench's calibration (None on one rank) and the link its floors are held against: ping-pong, then each
    collective of CALIBRATED_COLLECTIVES (zero's own ring reduce-scatter on Gloo only, where zero runs it). Collective;
    the calibration and the link's bandwidth are rank 0's."""
    world = cluster.info.world_size
    link = {"bandwidth_bytes_per_s": None, "allreduce_busbw_bytes_per_s": None}  # one rank has no link
    if world == 1:
        return None, link
    calibration = netmodel.calibrate(cluster.hosts, largest, iters, device, link_rate)
    fits = {name: collective_calibration(name, largest, iters, device)
            for name in CALIBRATED_COLLECTIVES if name != netmodel.RING_REDUCE_SCATTER or backend == "gloo"}
    if cluster.info.is_main:
        calibration.update(fits)
        network = netmodel.capped(netmodel.Network.from_dict(calibration["network"]), link_rate)
        calibration["network"] = network.as_dict()
        between_hosts = netmodel.Layout.of_hosts(list(cluster.hosts)).hosts > 1
        crossed = network.slowest if between_hosts else network.intra
        link["bandwidth_bytes_per_s"] = crossed.bandwidth
        link["measured_by"] = crossed.source + (", between hosts" if between_hosts else ", on one host")
    whole = fits[ALLREDUCE_FIT]  # its largest buffer, the gradients' size: the allreduce as training meets it
    link["allreduce_busbw_bytes_per_s"] = bus_bandwidth(whole["sizes"][-1], world, whole["seconds"][-1])
    return calibration, link


def advice_links(cluster: Cluster, *, advice_dir: str, fresh: bool, largest: int, iters: int, device,
                 link_rate: str | None) -> dict | None:
    """The advisor's links, on rank 0 (None elsewhere): the newest advice's on these hosts at this --link, unless
    --fresh, else measured here with messages up to `largest` bytes (at most CALIBRATION_BYTES). Collective."""
    largest = min(largest, CALIBRATION_BYTES)
    reused = None
    if cluster.info.is_main and not fresh:
        found = cache.reusable_calibration(advice_dir, cluster.hosts, link_rate)
        if found:
            path, data = found
            reused = {**data["calibration"], "reused_from": str(path)}
    reused = cluster.bcast(reused)
    if reused:
        if cluster.info.is_main:
            print(f"advise: reusing the calibration of {reused['reused_from']}, measured "
                  f"{cache.age(time.time() - reused['measured_at_s'])} ago (--fresh measures again)", flush=True)
        return reused if cluster.info.is_main else None
    if cluster.info.is_main:
        print(f"advise: calibrating the links (ping-pong, 1 KB .. {largest / 1e6:.1f} MB)", flush=True)
    measured = netmodel.calibrate(cluster.hosts, largest, iters, device, link_rate)
    if not cluster.info.is_main:
        return None
    network = netmodel.capped(netmodel.Network.from_dict(measured["network"]), link_rate)
    return {**measured, "network": network.as_dict(), "measured_at_s": time.time(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "reused_from": None}
