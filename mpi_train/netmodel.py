"""The alpha-beta time model of gradient sync: a link costs alpha + beta·m for an m-byte message.

Calibrated links (fitted by least squares from ping-pong times over message sizes, one
for ranks on the same host and one for ranks on different hosts) and a placement (N
ranks, R per host, numbered host by host as mpirun fills a hostfile) give each sync
method's predicted time per step from its declared `cost_model`:

- `ring`: each message (a tensor, a bucket or the whole flat buffer) takes 2(N-1) steps of
  S/N bytes: 2(N-1)·alpha + 2(N-1)/N·S·beta. With more than one host every step waits
  for the edge that crosses hosts, so alpha and beta are the inter-host link's.
- `root`: rank 0 gathers then scatters: 2(N-1) messages' latency, and its host's link
  carries (N-R)·S in and then (N-R)·S out, while its host's other R-1 ranks use memory:
  2(N-1)·alpha + 2·((N-R)·S·beta_inter + (R-1)·S·beta_intra).

S is what the method sends: the gradients' bytes times its compression ratio (half for a
float16 wire). How many messages a method sends (one per tensor: L latencies; one
buffer; or buckets) and whether it overlaps backward is its `Schedule`. For an
overlapped method the exposed time is what is left after backward: a bucket can leave
once backward has produced its last gradient (when, the bench measures: `Backward`;
without a measurement, backward time is shared among the tensors by their bytes, last
layer first), and buckets are sent one after the other; exposed = last bucket's end -
backward's end.

- `hierarchical`: a binomial-tree reduce to each host's leader and, at the end, a broadcast
  back, each ceil(log2 R) intra-host messages of S; between them a ring among the H host
  leaders: 2·ceil(log2 R)·(alpha_intra + S·beta_intra) + 2(H-1)·alpha + 2(H-1)/H·S·beta.
  On one host, or with one rank per host, it is `ring`.

A straggler host (stragglers.py: one link far slower than the others') is the network's `slow`
link: a ring, and the host leaders' ring of `hierarchical`, wait for it at every step; through
rank 0 (`root`) its link carries its own ranks' share (R·S each way), unless it is rank 0's
host, whose link carries everything.

A cost model is one function in TIME_MODELS, keyed like costs.COST_MODELS.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from . import stragglers
from .errors import UserError

UNLIMITED = "unlimited"
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def rate_bytes_per_s(link: str) -> Optional[float]:
    """Bytes/s of a tc-style rate ('1gbit', '100mbit'); None for 'unlimited'. ValueError for anything else."""
    text = link.strip().lower()
    if text == UNLIMITED:
        return None
    match = _RATE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"link {link!r} is not a rate: give bits per second like 10gbit, 1gbit or 100mbit, or "
                         f"{UNLIMITED!r}")
    return float(match.group(1)) * _UNITS[match.group(2)] / 8


# ---------------------------------------------------------------------------------------------
# Links and their calibration.

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
    def fit(cls, sizes: Sequence[float], seconds: Sequence[float], source: str = "fitted") -> "Link":
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


LOOPBACK = Link(alpha=50e-6, beta=1 / 2e9, source="assumed loopback: 50 us, 2 GB/s")  # Gloo over TCP on one host, CPU-bound
DEFAULT_ALPHA = 100e-6  # a switched network's per-message latency (TCP, one hop), when no calibration says otherwise


def nominal_link(link: str) -> Link:
    """The link a rate names: beta from the rate, an assumed latency; 'unlimited' is the loopback."""
    rate = rate_bytes_per_s(link)
    if rate is None:
        return LOOPBACK
    return Link(DEFAULT_ALPHA, 1 / rate, source=f"nominal {link}: {DEFAULT_ALPHA * 1e6:.0f} us, {rate / 1e6:g} MB/s")


@dataclass(frozen=True)
class Network:
    """The links of a cluster: between ranks on one host, and between hosts; `slow` is a straggler host's link
    (stragglers.py), `slow_is_root` whether that host is rank 0's."""

    intra: Link = LOOPBACK
    inter: Link = LOOPBACK
    slow: Optional[Link] = None
    slow_is_root: bool = False

    @property
    def slowest(self) -> Link:
        """The inter-host link a ring waits for at every step."""
        return self.slow or self.inter

    def without_slow(self) -> "Network":
        return Network(self.intra, self.inter)

    def as_dict(self) -> dict:
        return {"intra": asdict(self.intra), "inter": asdict(self.inter),
                **({"slow": asdict(self.slow), "slow_is_root": self.slow_is_root} if self.slow else {})}

    @classmethod
    def from_dict(cls, data: dict) -> "Network":
        slow = data.get("slow")
        return cls(Link(**data["intra"]), Link(**data["inter"]), Link(**slow) if slow else None,
                   bool(data.get("slow_is_root")))


def load_calibration(path: str | Path) -> Network:
    """The fitted links of a bench JSON (python -m mpi_train.bench --json), as a Network."""
    return _calibration(path)[0]


def load_backward(path: str | Path, tensors: int) -> "Backward":
    """When a bench JSON's model had each gradient ready in backward, if it timed one of `tensors` tensors; else
    the assumed profile."""
    backward = _calibration(path)[1]
    return backward if backward.ready is not None and len(backward.ready) == tensors else ASSUMED_BACKWARD


def _calibration(path: str | Path) -> tuple[Network, "Backward"]:
    try:
        data = json.loads(Path(path).read_text())
        links = data["calibration"]["network"]
        return Network.from_dict(links), Backward.from_dict(data["calibration"].get("backward"))
    except OSError as error:
        raise UserError(f"cannot read the calibration file {path}: {error.strerror or error}. Give a JSON written by "
                        f"python -m mpi_train.bench --json PATH.") from None
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"the calibration file {path} holds no fitted links ({type(error).__name__}: {error}); write one "
                        f"with python -m mpi_train.bench --json PATH (a bench JSON of this version).") from None


# ---------------------------------------------------------------------------------------------
# Placement and schedules.

@dataclass(frozen=True)
class Placement:
    """N ranks, R on each host (the last host may hold fewer), numbered host by host."""

    world: int
    ranks_per_host: int

    def __post_init__(self):
        if self.world < 1 or self.ranks_per_host < 1:
            raise ValueError(f"ranks ({self.world}) and ranks per host ({self.ranks_per_host}) must be at least 1")

    @property
    def hosts(self) -> int:
        return math.ceil(self.world / self.ranks_per_host)

    @property
    def local(self) -> int:
        """Ranks on rank 0's host."""
        return min(self.world, self.ranks_per_host)

    @classmethod
    def of_hosts(cls, hosts: Sequence[str]) -> "Placement":
        """The placement of a running job, from the host of each rank."""
        return cls(len(hosts), max(hosts.count(h) for h in set(hosts)))


@dataclass(frozen=True)
class Schedule:
    """How a method cuts its gradients into messages, and whether they overlap backward."""

    messages: str = "flat"  # "flat": one buffer; "per_tensor": one call per gradient (L latencies); "buckets"
    overlapped: bool = False  # sends while backward runs: only the part after backward is exposed
    bucket_mb: float = 25.0
    first_bucket_mb: float = 1.0  # DDP's (and bucketed's) first bucket, at most bucket_mb


SCHEDULES: dict[str, Schedule] = {  # by --sync name; a method not listed sends one flat buffer after backward
    "gather_scatter": Schedule("per_tensor"),
    "allreduce": Schedule("per_tensor"),
    "ddp": Schedule("buckets", overlapped=True),  # DistributedDataParallel's default bucket_cap_mb
    "ddp_fp16": Schedule("buckets", overlapped=True),
    "ddp_powersgd": Schedule("buckets", overlapped=True),
    "bucketed": Schedule("buckets", overlapped=True),
}


def schedule_of(name: str, method_class: type, bucket_mb: Optional[float] = None) -> Schedule:
    """A method's schedule: its class's `schedule` attribute if it declares one, else the table above."""
    from .sync.ddp import DDP

    schedule = getattr(method_class, "schedule", None) or SCHEDULES.get(name, Schedule())
    if bucket_mb is not None and schedule.messages == "buckets" and not issubclass(method_class, DDP):  # DDP keeps its own
        schedule = Schedule(schedule.messages, schedule.overlapped, bucket_mb)
    return schedule


def message_groups(tensor_bytes: Sequence[float], schedule: Schedule) -> list[list[int]]:
    """The tensors (indices in registration order) each message carries, in the order they are sent. Buckets fill in
    backward order (last tensor first)."""
    count = len(tensor_bytes)
    if schedule.messages == "per_tensor":
        return [[i] for i in range(count)]
    if schedule.messages == "flat":
        return [list(range(count))]
    from .sync.bucketed import fill_buckets

    backward_order = list(reversed(tensor_bytes))
    groups = fill_buckets(backward_order, schedule.bucket_mb * 2**20, min(schedule.first_bucket_mb, schedule.bucket_mb) * 2**20)
    return [[count - 1 - i for i in group] for group in groups]


def messages(tensor_bytes: Sequence[float], schedule: Schedule) -> list[float]:
    """Message sizes in the order they are sent."""
    return [float(sum(tensor_bytes[i] for i in group)) for group in message_groups(tensor_bytes, schedule)]


def compression_rounds(method_class: type, compression: str = "none") -> int:
    """How many sums a message of this method takes with --compression `compression` (PowerSGD: 2)."""
    from .sync.compression import COMPRESSORS

    return COMPRESSORS[method_class.compression_name(compression)].rounds_per_step


def compression_ratio(method_class: type) -> float:
    """Bytes on the wire per gradient byte: `compression_ratio` if declared, else from `wire_dtype` (float16: 0.5)."""
    declared = getattr(method_class, "compression_ratio", None)
    if declared is not None:
        return float(declared)
    from .costs import wire_bytes

    return wire_bytes(method_class, 1.0)


# ---------------------------------------------------------------------------------------------
# Time per message, by cost model.

def ring_time(size: float, placement: Placement, network: Network) -> float:
    n = placement.world
    if n == 1:
        return 0.0
    link = network.slowest if placement.hosts > 1 else network.intra
    return 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * size * link.beta


def root_time(size: float, placement: Placement, network: Network) -> float:
    n, local = placement.world, placement.local
    if n == 1:
        return 0.0
    alpha = network.slowest.alpha if placement.hosts > 1 else network.intra.alpha
    across = (n - local) * size * network.inter.beta  # rank 0's host link, each way
    if network.slow and placement.hosts > 1:  # a straggler: its own link carries its ranks' share, or all of it
        across = ((n - local) * size * network.slow.beta if network.slow_is_root
                  else max(across, placement.ranks_per_host * size * network.slow.beta))
    return 2 * (n - 1) * alpha + 2 * (across + (local - 1) * size * network.intra.beta)


def hierarchical_time(size: float, placement: Placement, network: Network) -> float:
    hosts, local = placement.hosts, placement.local
    if hosts == 1 or local == 1:
        return ring_time(size, placement, network)
    levels = math.ceil(math.log2(local))
    inside = 2 * levels * (network.intra.alpha + size * network.intra.beta)  # reduce to the leader, broadcast back
    leaders = network.slowest  # the leaders' ring waits for the slowest host's link
    return inside + 2 * (hosts - 1) * leaders.alpha + 2 * (hosts - 1) / hosts * size * leaders.beta


TIME_MODELS: dict[str, Callable[[float, Placement, Network], float]] = {
    "ring": ring_time,
    "root": root_time,
    "hierarchical": hierarchical_time,
}


@dataclass(frozen=True)
class Prediction:
    """A method's predicted communication per step, and what of it the step pays (exposed)."""

    method: str
    cost_model: str
    messages: int
    wire_bytes: float
    comm_s: float  # all its messages, one after the other
    overlapped: bool
    exposed_s: Optional[float] = None  # overlapped methods, given a backward time

    @property
    def sync_s(self) -> float:
        """What the step pays for communication: exposed for an overlapped method (comm when backward is unknown)."""
        return self.exposed_s if self.exposed_s is not None else self.comm_s


def exposed_time(message_times: Sequence[float], ready_s: Sequence[float], backward_s: float) -> float:
    """Messages sent one after the other, each once backward has produced its last gradient (`ready_s`, seconds into
    backward); what runs past the end of backward."""
    finish = 0.0
    for seconds, ready in zip(message_times, ready_s):
        finish = max(finish, ready) + seconds
    return max(0.0, finish - backward_s)


@dataclass(frozen=True)
class Backward:
    """When backward hands each gradient over: its length as a share of forward + backward, and for each tensor
    (registration order) the share of backward elapsed when its gradient is ready.

    The bench measures both on its no-sync replica (tools/bench.py, BackwardClock); without a measurement backward
    is 2/3 of compute and produces bytes at a constant rate, last layer first.
    """

    share: float = 2 / 3  # backward does about twice forward's work
    ready: Optional[tuple[float, ...]] = None

    def ready_times(self, tensor_bytes: Sequence[float], backward_s: float) -> list[float]:
        """Seconds into backward at which each tensor's gradient is ready (registration order)."""
        if self.ready is not None and len(self.ready) == len(tensor_bytes):
            return [backward_s * share for share in self.ready]
        total, done, times = sum(tensor_bytes) or 1.0, 0.0, [0.0] * len(tensor_bytes)
        for i in reversed(range(len(tensor_bytes))):  # backward runs from the last layer to the first
            done += tensor_bytes[i]
            times[i] = backward_s * done / total
        return times

    def as_dict(self) -> dict:
        return {"share": self.share, "ready": list(self.ready) if self.ready is not None else None}

    @classmethod
    def from_dict(cls, data: Optional[dict]) -> "Backward":
        if not data:
            return cls()
        return cls(float(data["share"]), tuple(data["ready"]) if data.get("ready") is not None else None)


ASSUMED_BACKWARD = Backward()


def predict(name: str, method_class: type, tensor_bytes: Sequence[float], placement: Placement, network: Network,
            backward_s: Optional[float] = None, bucket_mb: Optional[float] = None,
            ratio: Optional[float] = None, backward: Backward = ASSUMED_BACKWARD, rounds: int = 1) -> Optional[Prediction]:
    """The method's predicted sync per step; None when it declares no cost model this module knows. `ratio`
    (bytes on the wire per gradient byte) is the compressor's, when the method carries one (PowerSGD's factors),
    and `rounds` how many sums each message takes (PowerSGD: 2, P then Q; each round pays the latency again);
    `backward` says when each gradient is ready, for an overlapped method's exposed time (given `backward_s`)."""
    model = getattr(method_class, "cost_model", None)
    if model not in TIME_MODELS:
        return None
    schedule = schedule_of(name, method_class, bucket_mb)
    ratio = compression_ratio(method_class) if ratio is None else ratio
    groups = message_groups(tensor_bytes, schedule)
    sizes = [sum(tensor_bytes[i] for i in group) * ratio for group in groups]
    latency = TIME_MODELS[model](0.0, placement, network)
    times = [TIME_MODELS[model](size, placement, network) + (rounds - 1) * latency for size in sizes]
    exposed = None
    if schedule.overlapped and backward_s is not None:
        ready = backward.ready_times(tensor_bytes, backward_s)
        exposed = exposed_time(times, [max(ready[i] for i in group) for group in groups], backward_s)
    return Prediction(name, model, len(sizes), sum(sizes), sum(times), schedule.overlapped, exposed)


def tensor_sizes(model) -> list[int]:
    """Bytes of each trainable parameter's gradient, in registration order."""
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


# ---------------------------------------------------------------------------------------------
# Measuring links inside a job (collective: every rank calls these).

def calibration_sizes(largest: int, smallest: int = 1024, factor: int = 4) -> list[int]:
    """1 KB, 4 KB, ... and `largest` itself: the message sizes a calibration times."""
    sizes, size = [], smallest
    while size < largest:
        sizes.append(size)
        size *= factor
    return sizes + [max(largest, smallest)]


def ping_pong(peer: int, sizes: Sequence[int], iters: int, device, origin: int = 0,
              fastest: bool = False) -> Optional[list[float]]:
    """One-way seconds per size between `origin` and `peer` (median round trip / 2; the fastest with `fastest`), on
    `origin`; None elsewhere. Collective."""
    import statistics
    import time

    import torch
    import torch.distributed as dist

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


def peers(hosts: Sequence[str]) -> dict[str, Optional[int]]:
    """The rank rank 0 measures each link against: one on its own host (intra) and one on another host (inter)."""
    same = next((r for r in range(1, len(hosts)) if hosts[r] == hosts[0]), None)
    other = next((r for r in range(1, len(hosts)) if hosts[r] != hosts[0]), None)
    return {"intra": same, "inter": other}


def time_pairs(pairs: Sequence[tuple[int, int]], sizes: Sequence[int], iters: int, device,
               fastest: bool = False) -> list[tuple[Link, list]]:
    """Each pair's fitted link and one-way seconds per size, on every rank. Collective."""
    import torch.distributed as dist

    found = []
    for a, b in pairs:
        seconds = ping_pong(b, sizes, iters, device, origin=a, fastest=fastest)
        shared = [(Link.fit(sizes, seconds, source=f"ping-pong rank {a} <-> {b}"), seconds) if dist.get_rank() == a else None]
        dist.broadcast_object_list(shared, src=a)
        found.append(shared[0])
    return found


def find_straggler(hosts: Sequence[str], pairs: list, links: list, largest: int, iters: int, device,
                   cap: Optional[float]) -> tuple[dict, Optional[stragglers.Straggler]]:
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


def calibrate(hosts: Sequence[str], largest: int, iters: int, device, link: Optional[str] = None) -> Optional[dict]:
    """Fit both links by ping-pong over 1 KB .. `largest`; rank 0 gets {"network", "points", "host_links",
    "straggler"}. Collective.

    Intra-host: rank 0 with a rank on its host. Inter-host: every pair of stragglers.host_pairs (the hosts' first
    ranks, around the ring of hosts); the inter-host link is the slowest pair's, leaving out a straggler's pairs,
    which give the network's `slow` link.
    A link with no pair of ranks to measure it (one host; one rank per host) takes the other's fit. `link`, the rate
    the hosts were shaped to, caps the bandwidths compared to find a straggler."""
    import torch.distributed as dist

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


def describe_network(network: Network) -> str:
    def one(link: Link) -> str:
        return (f"alpha {link.alpha * 1e6:.0f} us, beta -> {link.bandwidth / 1e6:,.0f} MB/s "
                f"(fit error {100 * link.fit_error:.0f}%, {link.source})")

    slow = f"; a straggler host's: {one(network.slow)}" if network.slow else ""
    return f"intra-host: {one(network.intra)}; inter-host: {one(network.inter)}{slow}"


@dataclass(frozen=True)
class JobModel:
    """What a training job predicts for its own sync each step, and what a straggler host costs it."""

    prediction: Prediction
    network: Network
    placement: Placement
    tensor_bytes: list = field(default_factory=list)
    bucket_mb: Optional[float] = None
    ratio: Optional[float] = None  # the compressor's bytes on the wire per gradient byte
    rounds: int = 1  # the compressor's sums per message
    backward: Backward = ASSUMED_BACKWARD  # when each gradient is ready: measured by a bench (--calibration)
    host_links: dict = field(default_factory=dict)  # host -> bytes/s its link reached (empty with --calibration)
    straggler: Optional[stragglers.Straggler] = None

    def sync_time(self, compute_s: float, network: Optional[Network] = None) -> float:
        """Predicted sync seconds per step; for an overlapped method its exposed time behind this measured compute."""
        from .sync import SYNC_METHODS

        if not self.prediction.overlapped and network is None:
            return self.prediction.comm_s
        name = self.prediction.method
        again = predict(name, SYNC_METHODS[name], self.tensor_bytes, self.placement, network or self.network,
                        backward_s=self.backward.share * compute_s, bucket_mb=self.bucket_mb, ratio=self.ratio,
                        backward=self.backward, rounds=self.rounds)
        return again.sync_s

    def straggler_cost(self, compute_s: float) -> Optional[float]:
        """Seconds per step the straggler adds: the predicted sync with the measured links minus with the others'."""
        if self.straggler is None:
            return None
        return self.sync_time(compute_s) - self.sync_time(compute_s, self.network.without_slow())


QUICK_CALIBRATION_BYTES = 1 << 20  # a job's own ping-pong stops at 1 MB: well under a second even at 100 Mbit/s
QUICK_CALIBRATION_ITERS = 2


def job_model(config, cluster, model, method, device) -> Optional[JobModel]:
    """The prediction a training job logs beside its measured sync time; None on one rank or for an unmodelled method.

    Links come from --calibration (a bench JSON) when given, else from a short ping-pong now, which also finds a
    straggler host (stragglers.py). A --link rate caps the inter-host bandwidth: a shaper lets a burst through at
    full speed (tc tbf: 10 ms of traffic, 1.25 MB at 1 Gbit/s), so messages of at most 1 MB can see a shaped link as
    faster than it is. Collective."""
    from .sync import SYNC_METHODS

    hosts = list(cluster.hosts)
    if len(hosts) == 1:
        return None
    measured = {}
    sizes = tensor_sizes(model)
    backward = ASSUMED_BACKWARD
    if config.calibration:
        network = load_calibration(config.calibration)  # every rank reads it, so a bad file stops all of them together
        backward = load_backward(config.calibration, len(sizes))
    else:
        measured = cluster.bcast(calibrate(hosts, QUICK_CALIBRATION_BYTES, QUICK_CALIBRATION_ITERS, device, config.link)) or {}
        network = Network.from_dict(measured["network"]) if measured else None
    network = capped(network, config.link)
    straggler = stragglers.Straggler.from_dict(measured["straggler"]) if measured.get("straggler") else None
    placement = Placement.of_hosts(hosts)
    ratio = method.wire_bytes(list(model.parameters())) / sum(sizes)  # what its compressor sends
    rounds = method.compressor.rounds_per_step
    prediction = predict(config.sync, SYNC_METHODS[config.sync], sizes, placement, network, bucket_mb=config.bucket_mb,
                         ratio=ratio, rounds=rounds)
    if prediction is None:
        return None
    return JobModel(prediction, network, placement, sizes, config.bucket_mb, ratio, rounds, backward,
                    measured.get("host_links", {}), straggler)


def capped(network: Network, link: Optional[str]) -> Network:
    """The network with its inter-host bandwidth at most the shaped rate `link` (a burst can look faster)."""
    rate = rate_bytes_per_s(link) if link else None
    if rate is None or network.inter.beta >= 1 / rate:
        return network
    return Network(network.intra, Link(network.inter.alpha, 1 / rate, network.inter.fit_error,
                                       f"{network.inter.source}; bandwidth capped at the {link} link"),
                   network.slow, network.slow_is_root)


def job_placement(hosts: Sequence[str]) -> dict:
    """Params every job records: how many hosts it spans and the most ranks on one of them."""
    placement = Placement.of_hosts(list(hosts))
    return {"num_hosts": len(set(hosts)), "ranks_per_host": placement.ranks_per_host}
