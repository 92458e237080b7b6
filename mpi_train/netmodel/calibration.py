"""Calibrating links: timed inside a job (ping-pong between ranks, collective), or read back from a bench JSON.

Intra-host: rank 0 with a rank on its host. Inter-host: the first ranks of neighbouring hosts,
around the ring of hosts (stragglers.py), so a host whose link is far slower than the others'
is found as well. Each pair's one-way times over message sizes are fitted to alpha + beta·m
(links.Link.fit). `python -m mpi_train bench --json` keeps the fits, with when backward had each
gradient ready (prediction.Backward) and its fits of the allreduce, reduce-scatter and all-gather
over all ranks, for a job's or predict's --calibration: the last two become the network's measured
collective costs (collective_costs), which price the sharded families as the backend runs them.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist

from .. import stragglers
from ..cluster import GroupChannel
from ..errors import UserError
from .links import (
    ALL_GATHER,
    ALLREDUCE,
    PHASES,
    REDUCE_SCATTER,
    RING_REDUCE_SCATTER,
    CollectiveCost,
    Link,
    Network,
    rate_bytes_per_s,
)
from .prediction import ASSUMED_BACKWARD, Backward, Layout


def load_calibration(path: str | Path) -> Network:
    """The fitted links of a bench JSON (python -m mpi_train bench --json), as a Network."""
    return _calibration(path)[0]


def load_backward(path: str | Path, tensors: int) -> Backward:
    """When a bench JSON's model had each gradient ready in backward, if it timed one of `tensors` tensors; else
    the assumed profile."""
    backward = _calibration(path)[1]
    return backward if backward.ready is not None and len(backward.ready) == tensors else ASSUMED_BACKWARD


def network_problem(data) -> str | None:
    """What makes a calibration's "network" unfit to price messages with (a hand edit, another version's file), in
    words; None when its links and measured collectives are numbers the model can use."""
    try:
        network = Network.from_dict(data)
    except (TypeError, KeyError, AttributeError, ValueError) as error:
        return f"its links cannot be read ({type(error).__name__}: {error})"

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf

    links = {"intra-host": network.intra, "inter-host": network.inter, "slow host's": network.slow}
    for name, link in links.items():
        if link is not None and not (number(link.alpha) and number(link.beta)):
            return (f"its {name} link has alpha {link.alpha!r} s and beta {link.beta!r} s/byte, where a fit gives "
                    f"numbers of 0 or more")
    for cost in network.collectives:
        if not (number(cost.alpha) and number(cost.beta_factor)):
            return (f"its measured {cost.name} has alpha {cost.alpha!r} and beta_factor {cost.beta_factor!r}, where a "
                    f"fit gives numbers of 0 or more")
    return None


def _calibration(path: str | Path) -> tuple[Network, Backward]:
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or not isinstance(data.get("calibration"), dict):
            raise UserError(f"the calibration file {path} is not a bench's JSON (it holds no \"calibration\" with "
                            f"fitted links); write one with python -m mpi_train bench --json PATH.")
        problem = network_problem(data["calibration"].get("network"))
        if problem:
            raise UserError(f"the calibration file {path} cannot be used: {problem}. It was changed after the bench "
                            f"wrote it, or written by another version; write one with python -m mpi_train bench "
                            f"--json PATH.")
        network = Network.from_dict(data["calibration"]["network"])
        layout = data.get("layout")
        if layout and not network.collectives:  # the fits of the sharded collectives, held against the links
            network = with_collective_costs(network, data["calibration"],
                                            Layout(int(data["world_size"]), int(layout["ranks_per_host"])))
        return network, Backward.from_dict(data["calibration"].get("backward"))
    except OSError as error:
        raise UserError(f"cannot read the calibration file {path}: {error.strerror or error}. Give a JSON written by "
                        f"python -m mpi_train bench --json PATH.") from None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise UserError(f"the calibration file {path} holds no fitted links ({type(error).__name__}: {error}); write "
                        f"one with python -m mpi_train bench --json PATH (a bench JSON of this version).") from None


def collective_costs(fits: dict, layout: Layout, network: Network) -> tuple[CollectiveCost, ...]:
    """The allreduce, reduce-scatter and all-gather as the backend ran them, and zero's own ring reduce-scatter where
    the bench timed it (`fits`: a bench calibration's alpha-beta fit of each over the whole buffer's bytes, on
    `layout`), held against a ring's on the link they crossed (the slowest between hosts, else the intra-host link):
    alpha per ring step = alpha / (P·(N-1)); bytes factor = beta / (P·(N-1)/N·beta_link), P the collective's
    half-rings (an allreduce's 2). Priced back on the same layout and link they give the fits again; on others, the
    measured latency per step and the backend's share of the link's bandwidth carry over. The allreduce's latency
    is what a per-call cost needs: a ping-pong's fit between shaped hosts often puts the link's alpha at 0. Empty
    for one rank or a fit missing."""
    n = layout.world
    link = network.slowest if layout.hosts > 1 else network.intra
    if n < 2 or link.beta <= 0:
        return ()
    where = f"{n} ranks on {layout.hosts} host(s)"
    costs = []
    for name in (ALLREDUCE, REDUCE_SCATTER, ALL_GATHER, RING_REDUCE_SCATTER):
        if fits.get(name):
            phases = PHASES.get(name, 1)
            costs.append(CollectiveCost(name, fits[name]["alpha"] / (phases * (n - 1)),
                                        fits[name]["beta"] / (phases * (n - 1) / n * link.beta), f"fitted on {where}"))
    return tuple(costs)


def with_collective_costs(network: Network, fits: dict, layout: Layout) -> Network:
    """`network` carrying the measured costs of its collectives (collective_costs)."""
    return replace(network, collectives=collective_costs(fits, layout, network))


def calibration_sizes(largest: int, smallest: int = 1024, factor: int = 4) -> list[int]:
    """1 KB, 4 KB, ... and `largest` itself: the message sizes a calibration times."""
    sizes, size = [], smallest
    while size < largest:
        sizes.append(size)
        size *= factor
    return sizes + [max(largest, smallest)]


def ping_pong(peer: int, sizes: Sequence[int], iters: int, device, origin: int = 0,
              fastest: bool = False) -> list[float] | None:
    """One-way seconds per size between `origin` and `peer` (median round trip / 2; the fastest with `fastest`), on
    `origin`; None elsewhere. Collective."""
    rank = dist.get_rank()
    result = []
    for size in sizes:
        buffer = torch.zeros(max(1, size // 4), device=device)
        seconds = []
        for i in range(iters + 1):  # the first round trip may open the connection: not timed
            dist.barrier()
            started = time.perf_counter()
            if rank == origin:
                dist.send(buffer, dst=peer)
                dist.recv(buffer, src=peer)
            elif rank == peer:
                dist.recv(buffer, src=origin)
                dist.send(buffer, dst=origin)
            if i:
                seconds.append(time.perf_counter() - started)
        result.append((min(seconds) if fastest else statistics.median(seconds)) / 2)
    return result if rank == origin else None


def peers(hosts: Sequence[str]) -> dict[str, int | None]:
    """The rank rank 0 measures each link against: one on its own host (intra) and one on another host (inter)."""
    same = next((r for r in range(1, len(hosts)) if hosts[r] == hosts[0]), None)
    other = next((r for r in range(1, len(hosts)) if hosts[r] != hosts[0]), None)
    return {"intra": same, "inter": other}


def time_pairs(pairs: Sequence[tuple[int, int]], sizes: Sequence[int], iters: int, device,
               fastest: bool = False) -> list[tuple[Link, list]]:
    """Each pair's fitted link and one-way seconds per size, on every rank. Collective."""
    found = []
    for a, b in pairs:
        seconds = ping_pong(b, sizes, iters, device, origin=a, fastest=fastest)
        fit = asdict(Link.fit(sizes, seconds, source=f"ping-pong rank {a} <-> {b}")) if dist.get_rank() == a else None
        link, times = GroupChannel(src=a).bcast([fit, seconds])  # rank a's, as plain data
        found.append((Link(**link), times))
    return found


def find_straggler(hosts: Sequence[str], pairs: list, links: list, largest: int, iters: int, device,
                   cap: float | None) -> tuple[dict, stragglers.Straggler | None]:
    """Each host's bandwidth (at most `cap`, the shaped rate, since a burst can look faster) and the straggler, if
    any. A suspect's pairs are timed again, keeping the fastest round trip: a busy moment (or a shaper whose burst
    allowance ran out) only ever slows one. Collective; `links` is updated in place with the re-timed fits."""
    def per_host() -> dict:
        return stragglers.host_bandwidths(hosts, pairs, [min(link.bandwidth, cap or math.inf) for link in links])

    measured = per_host()
    suspect = stragglers.find(hosts, measured)
    if suspect is None:
        return measured, None
    through = [i for i in range(len(pairs)) if i not in stragglers.pairs_without(suspect, hosts, pairs)]
    again = time_pairs([pairs[i] for i in through], [max(1024, largest // 4), largest], iters + 2, device, fastest=True)
    for i, (link, _) in zip(through, again):
        if link.bandwidth > links[i].bandwidth:
            links[i] = link
    measured = per_host()
    return measured, stragglers.find(hosts, measured)


def calibrate(hosts: Sequence[str], largest: int, iters: int, device, link: str | None = None) -> dict | None:
    """Fit both links by ping-pong over 1 KB .. `largest`; rank 0 gets {"network", "points", "host_links",
    "straggler"}. Collective.

    Intra-host: rank 0 with a rank on its host. Inter-host: every pair of stragglers.host_pairs (the hosts' first
    ranks, around the ring of hosts); the inter-host link is the slowest pair's, leaving out a straggler's pairs,
    which give the network's `slow` link.
    A link with no pair of ranks to measure it (one host; one rank per host) takes the other's fit. `link`, the rate
    the hosts were shaped to, caps the bandwidths compared to find a straggler."""
    sizes = calibration_sizes(largest)
    found: dict[str, Link] = {}
    points: dict[str, dict] = {}
    intra_peer = peers(hosts)["intra"]
    if intra_peer is not None:
        seconds = ping_pong(intra_peer, sizes, iters, device)
        if seconds is not None:
            found["intra"] = Link.fit(sizes, seconds, source=f"ping-pong rank 0 <-> {intra_peer}")
            points["intra"] = {"peer": intra_peer, "sizes": sizes, "seconds": seconds}
    pairs = stragglers.host_pairs(hosts)
    timed = time_pairs(pairs, sizes, iters, device)
    for (a, b), (_, seconds) in zip(pairs, timed):
        points[f"inter {a}<->{b}"] = {"origin": a, "peer": b, "sizes": sizes, "seconds": seconds}
    pair_links = [fit for fit, _ in timed]
    per_host, straggler = find_straggler(hosts, pairs, pair_links, largest, iters, device,
                                         rate_bytes_per_s(link) if link else None)
    if dist.get_rank() != 0:
        return None
    slow = None
    if straggler:  # the others' pairs give the inter-host link, the straggler's its own
        others = stragglers.pairs_without(straggler, hosts, pairs)
        slow = max((fit for i, fit in enumerate(pair_links) if i not in others), key=lambda fit: fit.time(largest))
        pair_links = [pair_links[i] for i in others]
    if pair_links:
        found["inter"] = max(pair_links, key=lambda fit: fit.time(largest))
    if not found:
        return None
    intra = found.get("intra", found.get("inter"))
    inter = found.get("inter", intra)
    network = Network(intra, inter, slow, straggler is not None and straggler.host == hosts[0])
    return {"network": network.as_dict(), "points": points, "host_links": per_host,
            "straggler": straggler.as_dict() if straggler else None}
