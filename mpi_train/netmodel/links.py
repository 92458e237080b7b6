"""Links and networks: a link costs alpha + beta·m seconds for an m-byte message.

A `Link` is fitted by least squares from timed messages (calibration.py); a `Network` holds the
link between ranks on one host, the link between hosts, and a straggler host's slower one, and
what a calibration measured of the backend's reduce-scatter and all-gather (`CollectiveCost`).
Rates are written as tc writes them (`1gbit`, `100mbit`), as test hosts are shaped.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

UNLIMITED = "unlimited"
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
MIN_RATE_BITS = 1e3  # below 1kbit a model's gradients take days a step: a typo for a unit, not a network


def rate_bytes_per_s(link: str) -> float | None:
    """Bytes/s of a tc-style rate ('1gbit', '100mbit'); None for 'unlimited'. ValueError for anything else."""
    text = link.strip().lower()
    if text == UNLIMITED:
        return None
    match = _RATE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"link {link!r} is not a rate: give bits per second like 10gbit, 1gbit or 100mbit, or "
                         f"{UNLIMITED!r}")
    bits = float(match.group(1)) * _UNITS[match.group(2)]
    if bits < MIN_RATE_BITS:
        raise ValueError(f"link {link!r} is below 1kbit, where one step's messages would take days: give bits per "
                         f"second like 10gbit, 1gbit or 100mbit (was a unit left out?)")
    return bits / 8


@dataclass(frozen=True)
class Link:
    """One message of m bytes takes alpha + beta·m seconds; fit_error is the fit's relative RMS error."""

    alpha: float  # seconds: latency per message
    beta: float  # seconds per byte: 1 / bandwidth
    fit_error: float = 0.0
    source: str = "assumed"

    def time(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes

    @property
    def bandwidth(self) -> float:
        return 1 / self.beta if self.beta > 0 else math.inf

    @classmethod
    def fit(cls, sizes: Sequence[float], seconds: Sequence[float], source: str = "fitted") -> Link:
        """beta: the least-squares slope of seconds against size (large messages dominate, as they do a gradient sync);
        alpha: the median of what the smaller half of the sizes take beyond beta·m (their latency), at least 0.
        A plain least-squares intercept would let the noise of a large message swamp the latency of a small one."""
        if len(sizes) != len(seconds) or len(sizes) < 2:
            raise ValueError("a link fit needs at least two (size, seconds) points")
        n = len(sizes)
        mean_x, mean_y = sum(sizes) / n, sum(seconds) / n
        sxx = sum((x - mean_x) ** 2 for x in sizes)
        beta = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, seconds)) / sxx) if sxx else 0.0
        small = sorted(zip(sizes, seconds))[: max(1, n // 2)]
        alpha = max(0.0, statistics.median(y - beta * x for x, y in small))
        error = math.sqrt(sum(((alpha + beta * x) / y - 1) ** 2 for x, y in zip(sizes, seconds)) / n)
        return cls(alpha, beta, error, source)


# Gloo between ranks on one host: TCP over loopback, CPU-bound (there is no shared-memory transport in torch's Gloo).
LOOPBACK_LINK = Link(alpha=50e-6, beta=1 / 2e9, source="assumed loopback: 50 us, 2 GB/s")
DEFAULT_ALPHA = 100e-6  # a switched network's per-message latency (TCP, one hop), when no calibration says otherwise


def nominal_link(link: str) -> Link:
    """The link a rate names: beta from the rate, an assumed latency; 'unlimited' is the loopback."""
    rate = rate_bytes_per_s(link)
    if rate is None:
        return LOOPBACK_LINK
    return Link(DEFAULT_ALPHA, 1 / rate, source=f"nominal {link}: {DEFAULT_ALPHA * 1e6:.0f} us, {rate / 1e6:g} MB/s")


REDUCE_SCATTER, ALL_GATHER = "reduce_scatter", "all_gather"  # the sharded collectives a calibration measures
RING_REDUCE_SCATTER = "ring_reduce_scatter"  # and zero's own ring over point-to-point, which it runs on Gloo
ALLREDUCE = "allreduce"  # and the allreduce itself: on a ring, a reduce-scatter then an all-gather
PHASES = {ALLREDUCE: 2}  # the half-rings each collective runs (1 for the others)


@dataclass(frozen=True)
class CollectiveCost:
    """A collective as the backend runs it, measured (calibration.collective_costs) and held against a ring's: each
    of its N-1 steps pays `alpha`, and its (N-1)/N·S bytes take `beta_factor` times what the link's beta gives them.
    A bandwidth-optimal backend (NCCL) has a factor near 1; Gloo over TCP runs its reduce-scatter well above. An
    allreduce runs two such half-rings (PHASES), 2(N-1) steps."""

    name: str  # REDUCE_SCATTER, ALL_GATHER, RING_REDUCE_SCATTER or ALLREDUCE
    alpha: float  # seconds per step of the ring: the fit's latency over its phases·(N-1) steps
    beta_factor: float  # the fit's seconds per byte over a ring's phases·(N-1)/N·beta on the link it crossed
    source: str = "measured"

    @property
    def phases(self) -> int:
        return PHASES.get(self.name, 1)

    def time(self, size: float, world: int, link: Link) -> float:
        """Seconds for S bytes on `world` ranks whose slowest crossing is `link`."""
        return self.phases * ((world - 1) * self.alpha + self.beta_factor * (world - 1) / world * size * link.beta)


@dataclass(frozen=True)
class Network:
    """The links of a cluster: between ranks on one host, and between hosts; `slow` is a straggler host's link
    (stragglers.py), `slow_is_root` whether that host is rank 0's."""

    intra: Link = LOOPBACK_LINK
    inter: Link = LOOPBACK_LINK
    slow: Link | None = None
    slow_is_root: bool = False
    collectives: tuple[CollectiveCost, ...] = ()  # measured on the backend; none: a ring's bytes and the link's alpha

    def cost(self, *names: str) -> CollectiveCost | None:
        """The measured cost of the first of `names` (REDUCE_SCATTER, ...) a calibration measured, if any."""
        return next((cost for name in names for cost in self.collectives if cost.name == name), None)

    @property
    def slowest(self) -> Link:
        """The inter-host link a ring waits for at every step."""
        return self.slow or self.inter

    def without_slow(self) -> Network:
        return replace(self, slow=None, slow_is_root=False)

    def as_dict(self) -> dict:
        return {"intra": asdict(self.intra), "inter": asdict(self.inter),
                **({"slow": asdict(self.slow), "slow_is_root": self.slow_is_root} if self.slow else {}),
                **({"collectives": [asdict(cost) for cost in self.collectives]} if self.collectives else {})}

    @classmethod
    def from_dict(cls, data: dict) -> Network:
        slow = data.get("slow")
        return cls(Link(**data["intra"]), Link(**data["inter"]), Link(**slow) if slow else None,
                   bool(data.get("slow_is_root")),
                   tuple(CollectiveCost(**cost) for cost in data.get("collectives", ())))


def capped(network: Network, link: str | None) -> Network:
    """The network with its inter-host bandwidth at most the shaped rate `link` (a burst can look faster)."""
    rate = rate_bytes_per_s(link) if link else None
    if rate is None or network.inter.beta >= 1 / rate:
        return network
    return replace(network, inter=Link(network.inter.alpha, 1 / rate, network.inter.fit_error,
                                       f"{network.inter.source}; bandwidth capped at the {link} link"))


def describe_network(network: Network) -> str:
    def one(link: Link) -> str:
        return (f"alpha {link.alpha * 1e6:.0f} us, beta -> {link.bandwidth / 1e6:,.0f} MB/s "
                f"(fit error {100 * link.fit_error:.0f}%, {link.source})")

    slow = f"; a straggler host's: {one(network.slow)}" if network.slow else ""
    measured = "".join(f"; {describe_cost(cost)}" for cost in network.collectives)
    return f"intra-host: {one(network.intra)}; inter-host: {one(network.inter)}{slow}{measured}"


def describe_cost(cost: CollectiveCost) -> str:
    return (f"{cost.name} as measured: {cost.alpha * 1e3:.2f} ms per ring step, {cost.beta_factor:.2f}x a ring's "
            f"bytes ({cost.source})")
