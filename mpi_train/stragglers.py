"""A straggler host: one whose link is far slower than the others', found at start and priced with the time model.

Every sync that crosses hosts waits, step after step, for its slowest edge, so one slow link
sets the pace of every rank; and because every rank waits alike, per-rank sync times cannot
tell which host it is. So a job that spans hosts measures its hosts' links: the first rank of
each host ping-pongs with the first rank of the next host, around the ring of hosts. A host
both of whose pairs are slow, while a pair without it is fast, is the straggler; its cost per
step is the model's sync time with the measured links minus the same with the others' link.
With two hosts there is one pair: a slow link between them cannot be pinned on either host.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .liveness import host_with_ranks

SLOW_FACTOR = 0.5  # a host whose link is under half the median of the others' is named


def leaders(hosts: Sequence[str]) -> list[int]:
    """The first rank of each host, in the order the hosts first appear."""
    seen: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        seen.setdefault(host, rank)
    return list(seen.values())


def host_pairs(hosts: Sequence[str]) -> list[tuple[int, int]]:
    """The pairs of host leaders to time: each with the next host's, around the ring (one pair for two hosts)."""
    firsts = leaders(hosts)
    if len(firsts) < 2:
        return []
    if len(firsts) == 2:
        return [(firsts[0], firsts[1])]
    return [(firsts[i], firsts[(i + 1) % len(firsts)]) for i in range(len(firsts))]


def host_bandwidths(hosts: Sequence[str], pairs: Sequence[tuple[int, int]],
                    bandwidths: Sequence[float]) -> dict[str, float]:
    """Bytes/s each host's link reaches at least: the fastest measured pair through it (a pair runs at its slower
    end)."""
    result: dict[str, float] = {}
    for (a, b), rate in zip(pairs, bandwidths):
        for rank in (a, b):
            result[hosts[rank]] = max(result.get(hosts[rank], 0.0), rate)
    return result


@dataclass(frozen=True)
class Straggler:
    """The slow host, its ranks, its link's bandwidth and the median of the other hosts' (bytes/s)."""

    host: str
    ranks: tuple[int, ...]
    bandwidth: float
    others_bandwidth: float

    def describe(self) -> str:
        return (f"{host_with_ranks(self.host, self.ranks)}: its link measured {self.bandwidth / 1e6:,.1f} MB/s against "
                f"{self.others_bandwidth / 1e6:,.1f} MB/s for the other hosts")

    def as_dict(self) -> dict:
        return {**asdict(self), "ranks": list(self.ranks)}

    @classmethod
    def from_dict(cls, data: dict) -> Straggler:
        return cls(data["host"], tuple(data["ranks"]), data["bandwidth"], data["others_bandwidth"])


def find(hosts: Sequence[str], per_host: dict[str, float]) -> Straggler | None:
    """The slowest host, if its link is under SLOW_FACTOR of the other hosts' median; None with fewer than 3 hosts."""
    if len(per_host) < 3:
        return None
    host = min(per_host, key=per_host.get)
    others = statistics.median(rate for name, rate in per_host.items() if name != host)
    if per_host[host] >= SLOW_FACTOR * others:
        return None
    return Straggler(host, tuple(r for r, h in enumerate(hosts) if h == host), per_host[host], others)


def pairs_without(straggler: Straggler, hosts: Sequence[str], pairs: Sequence[tuple[int, int]]) -> list[int]:
    """Indexes of the pairs that do not go through the straggler: what the links would be without it."""
    return [i for i, (a, b) in enumerate(pairs) if straggler.host not in (hosts[a], hosts[b])]


def priced(model, compute_time_s: float) -> dict:
    """The straggler of `model` (netmodel.JobModel) and what it costs each step given the measured compute: the
    model's sync time with the measured links less the same without its link, which the summary keeps."""
    cost = model.straggler_cost(compute_time_s)
    without = model.sync_time(compute_time_s, model.network.without_slow())
    return {**model.straggler.as_dict(), "cost_s": cost, "predicted_sync_without_s": without}
