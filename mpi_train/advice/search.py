"""Which lossless sync method, at which bucket size, the alpha-beta model expects to step fastest.

Lossless: a registered method that averages the gradients at every step (`averages` is
GRADIENTS) and sends them as they are (no compression, none fixed in its name). Prediction is
cheap, so the search is exhaustive: every such method once, and a method whose buckets follow
--bucket-mb (`bucketed`) at every bucket size that cuts the gradients differently. Buckets fill
in backward order and close once they reach their cap (sync/messages.py), so they change only
where the cap crosses the bytes of a run of consecutive gradients: those sums, from the smallest
gradient to the whole model, are every distinct setting, each tried at the roundest size that
gives it (the default, 25 MB, where it does). A step is predicted as the measured step without
sync plus the method's exposed communication (netmodel.predict: all of it after backward, what
outlasts backward for an overlapped method).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..config import TrainConfig
from ..netmodel import Backward, Layout, Link, Network, family_of, predict
from ..sync import BASELINE, GRADIENTS, SYNC_METHODS, SyncMethod, backend_error, build_method
from ..sync.bucketed import DEFAULT_BUCKET_MB
from ..sync.messages import backward_order, message_groups

REFERENCE = BASELINE  # what every user would otherwise run: always measured beside the best predicted
FREE = Link(0.0, 0.0, source="free")  # a link that costs nothing: what a method's time is without it
FULL_BENCH_MB = (1.0, 2.0, 4.0, 8.0, 16.0, DEFAULT_BUCKET_MB, 50.0)  # the full bench's bucket sizes: powers of two
TIE = 0.005  # bucket sizes predicted within this share of the fastest are as good: the rounder one is kept


@dataclass(frozen=True)
class Candidate:
    """One configuration a job can run: a lossless method, and its bucket size if its buckets follow --bucket-mb."""

    sync: str
    bucket_mb: float | None = None

    @property
    def label(self) -> str:
        """`bucketed@8MB`, or the method alone."""
        return self.sync if self.bucket_mb is None else f"{self.sync}@{self.bucket_mb:g}MB"

    @property
    def flags(self) -> list[str]:
        """What to add to `python -m mpi_train` to run it."""
        return ["--sync", self.sync] + ([] if self.bucket_mb is None else ["--bucket-mb", f"{self.bucket_mb:g}"])

    def method(self, precision: str = "32-true") -> SyncMethod:
        """The method as a job with these flags configures it, at --precision `precision` (fsdp's gathers follow
        it)."""
        bucket = DEFAULT_BUCKET_MB if self.bucket_mb is None else self.bucket_mb
        return build_method(self.sync, TrainConfig(sync=self.sync, bucket_mb=bucket, precision=precision))

    def as_dict(self) -> dict:
        return {"label": self.label, "sync": self.sync, "bucket_mb": self.bucket_mb, "flags": self.flags}

    @classmethod
    def from_dict(cls, data: dict) -> Candidate:
        return cls(data["sync"], data.get("bucket_mb"))


@dataclass(frozen=True)
class StepModel:
    """What a step's prediction rests on: the gradients' sizes and when backward has them ready, the ranks' layout,
    the calibrated links, and the step measured without any sync (whole, and its forward + backward)."""

    tensor_bytes: tuple[float, ...]
    layout: Layout
    network: Network
    backward: Backward
    compute_s: float
    baseline_step_s: float
    units: tuple | None = None  # each tensor's layer block (netmodel.tensor_units): fsdp's messages
    precision: str = "32-true"  # what the step computes in, resolved: fsdp gathers its parameters in it

    @property
    def backward_s(self) -> float:
        return self.backward.share * self.compute_s


@dataclass(frozen=True)
class Predicted:
    """A candidate's predicted step: the step without sync plus its exposed communication, of `comm_s` in all."""

    candidate: Candidate
    step_s: float
    exposed_s: float
    comm_s: float
    messages: int
    binds: str  # what holds its communication up (binding)

    def as_dict(self) -> dict:
        return {**self.candidate.as_dict(), "predicted_step_s": self.step_s, "predicted_exposed_s": self.exposed_s,
                "predicted_comm_s": self.comm_s, "messages": self.messages, "binds": self.binds}


def lossless(backend: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The lossless methods a job can run on `backend`, in registry order, and those it cannot, with the reason. A
    method without a collective family (netmodel/families.py) cannot be predicted and is left out."""
    usable, refused = [], []
    for name, method in SYNC_METHODS.items():
        if method.traits.averages != GRADIENTS or method.traits.fixed_compression or family_of(method) is None:
            continue
        why = backend_error(name, backend)
        if why:
            refused.append((name, why))
        else:
            usable.append(name)
    return usable, refused


def follows_bucket_size(sync: str) -> bool:
    """Whether --bucket-mb changes how the method cuts its messages: its traits list bucket_mb among its tunables
    (bucketed does; ddp keeps torch's own buckets)."""
    return "bucket_mb" in SYNC_METHODS[sync].traits.tunables


def digits(value: float) -> int:
    """Significant digits `value` is written with (7: more than `:g` writes)."""
    return next((d for d in range(1, 7) if float(f"{value:.{d}g}") == value), 7)


def roundest(low: float, high: float) -> float | None:
    """The number in (low, high] with the fewest significant digits (at most 6, what `:g` writes), the largest of
    those, or the default bucket size if it is in range; high = inf: the smallest one-digit number above low. None
    if the range is narrower than 6 digits tell."""
    if high <= 0 or low >= high:
        return None
    if low < DEFAULT_BUCKET_MB <= high:
        return DEFAULT_BUCKET_MB
    if math.isinf(high):
        scale = 10.0 ** math.floor(math.log10(low)) if low > 0 else 1.0
        return float(f"{(math.floor(low / scale) + 1) * scale:.1g}")
    for digits in range(1, 7):
        scale = 10.0 ** (math.floor(math.log10(high)) - digits + 1)
        value = float(f"{math.floor(high / scale) * scale:.{digits}g}")
        if low < value <= high:
            return value
    return None


def bucket_sizes(tensor_bytes: Sequence[float], order: Sequence[int] | None = None) -> list[float]:
    """Bucket sizes in MB, smallest first, at least one for every way of cutting the gradients into buckets: the
    roundest size at or below each sum of consecutive gradients in backward order (`order`, as measured; else the
    last first), and above the one before it. Any size beyond the whole model cuts as the whole model does (the
    default, 25 MB, then stands for it). Sizes of one cut are told apart by `candidates`, which knows the method's
    first bucket."""
    ordered = [tensor_bytes[i] for i in backward_order(len(tensor_bytes), order)]
    sums = set()
    for start in range(len(ordered)):
        total = 0.0
        for size in ordered[start:]:
            total += size
            sums.add(total)
    edges = sorted(sums)
    sizes = []
    for low, high in zip([0.0, *edges], edges):  # every cap in (low, high] cuts the same buckets
        if high == edges[-1]:
            high = math.inf  # and so does any above the whole model
        value = roundest(low / 2**20, high / 2**20)
        if value is not None:
            sizes.append(value)
    return sizes


def candidates(names: Sequence[str], tensor_bytes: Sequence[float], order: Sequence[int] | None = None,
               bucket_sizes_mb: Sequence[float] | None = None) -> list[Candidate]:
    """Every method of `names` once, and one that follows --bucket-mb at each of `bucket_sizes_mb` (default:
    bucket_sizes) that cuts its buckets differently, named by the default size or else the roundest of those that
    cut alike."""
    sizes = list(bucket_sizes_mb) if bucket_sizes_mb is not None else bucket_sizes(tensor_bytes, order)
    found = []
    for name in names:
        if not follows_bucket_size(name):
            found.append(Candidate(name))
            continue
        cuts: dict[str, Candidate] = {}
        for size in sorted(sizes, key=lambda mb: (mb != DEFAULT_BUCKET_MB, digits(mb), -mb)):
            traits = Candidate(name, size).method().traits
            cut = message_groups(tensor_bytes, traits.messages, traits.bucket_caps, order)
            cuts.setdefault(str(cut), Candidate(name, size))
        found.extend(sorted(cuts.values(), key=lambda candidate: candidate.bucket_mb))
    return found


def binding(candidate: Candidate, model: StepModel, method: SyncMethod | None = None) -> str:
    """What holds the candidate's step up: nothing when backward hides its communication, else the link whose cost
    weighs most in it (its time with that link made free falls furthest)."""
    method = method or candidate.method(model.precision)

    def exposed(network: Network) -> float:
        return predict(method, model.tensor_bytes, model.layout, network, backward_s=model.backward_s,
                       backward=model.backward, units=model.units).sync_s

    full = exposed(model.network)
    if full <= 1e-6:
        return "nothing: backward hides its communication"
    between = full - exposed(replace(model.network, inter=FREE, slow=None, slow_is_root=False))
    within = full - exposed(replace(model.network, intra=FREE))
    if model.layout.hosts > 1 and between >= within:
        slow = model.network.slow is not None
        link = model.network.slowest
        return (f"the {'straggler host' if slow else 'between-host'} link ({link.bandwidth / 1e6:,.1f} MB/s, "
                f"{link.alpha * 1e6:.0f} us a message)")
    link = model.network.intra
    return f"the within-host link ({link.bandwidth / 1e6:,.1f} MB/s, {link.alpha * 1e6:.0f} us a message)"


def predicted(candidate: Candidate, model: StepModel) -> Predicted:
    """The candidate's predicted step on the model's network."""
    method = candidate.method(model.precision)
    prediction = predict(method, model.tensor_bytes, model.layout, model.network, label=candidate.label,
                         backward_s=model.backward_s, backward=model.backward, units=model.units)
    return Predicted(candidate=candidate, step_s=model.baseline_step_s + prediction.sync_s,
                     exposed_s=prediction.sync_s, comm_s=prediction.comm_s,
                     messages=prediction.messages, binds=binding(candidate, model, method))


def ranked(found: Sequence[Candidate], model: StepModel) -> list[Predicted]:
    """Every candidate predicted, fastest first; where two tie to the microsecond, the one with fewer messages (each
    pays a latency, and a bucket its hooks' work, which the model leaves out)."""
    return sorted((predicted(candidate, model) for candidate in found),
                  key=lambda p: (round(p.step_s, 6), p.messages, -(p.candidate.bucket_mb or 0.0)))


def best_of_each(ranking: Sequence[Predicted], tie: float = TIE) -> list[Predicted]:
    """Each method's best predicted configuration, fastest first: of its bucket sizes predicted within `tie` (a
    share) of its fastest, the default if it is one, else the roundest, then the one with fewer messages."""
    fastest: dict[str, float] = {}
    for one in ranking:
        fastest.setdefault(one.candidate.sync, one.step_s)
    best: dict[str, Predicted] = {}
    for one in ranking:
        if one.step_s > fastest[one.candidate.sync] * (1 + tie):
            continue
        size = one.candidate.bucket_mb
        key = (size != DEFAULT_BUCKET_MB, digits(size) if size is not None else 0, one.messages)
        held = best.get(one.candidate.sync)
        if held is None or key < (held.candidate.bucket_mb != DEFAULT_BUCKET_MB,
                                  digits(held.candidate.bucket_mb) if held.candidate.bucket_mb is not None else 0,
                                  held.messages):
            best[one.candidate.sync] = one
    return sorted(best.values(), key=lambda one: one.step_s)


def shortlist(ranking: Sequence[Predicted], count: int, reference: str = REFERENCE) -> list[Candidate]:
    """What the short bench measures: the best configuration of the `count` methods predicted fastest, the
    reference (ddp) at its best, and, beside a bucket size of the search, the default size."""
    best = best_of_each(ranking)
    chosen = [one.candidate for one in best[:count]]
    chosen += [one.candidate for one in best if one.candidate.sync == reference and one.candidate not in chosen]
    for one in list(chosen):
        default = Candidate(one.sync, DEFAULT_BUCKET_MB)
        if one.bucket_mb is not None and default not in chosen:
            chosen.append(default)
    return chosen


def full_grid(found: Sequence[Candidate], also: Sequence[Candidate] = (),
              sizes_mb: Sequence[float] = FULL_BENCH_MB) -> list[Candidate]:
    """What a full bench measures to check the advice: every method found, a method that follows --bucket-mb at
    each of `sizes_mb` (a bench's grid, the default among them) rather than at every cut, and `also` (what the
    advice measured, its recommendation among them)."""
    grid = [c for c in found if c.bucket_mb is None]
    for name in dict.fromkeys(c.sync for c in found if c.bucket_mb is not None):
        grid += [Candidate(name, mb) for mb in sizes_mb]
    return list(dict.fromkeys([*grid, *also]))


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Kendall's tau-b between two rankings (1: the same order, -1: reversed); None for fewer than two pairs."""
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    pairs = (concordant + discordant + ties_x) * (concordant + discordant + ties_y)
    return (concordant - discordant) / math.sqrt(pairs) if pairs else None
