"""`python -m mpi_train bench`: what each sync method costs, measured side by side and held against its cost model.

    mpirun -np 4 --hostfile hostfile python -m mpi_train bench --steps 20 --json bench.json

Every registered sync method with every compression it can carry (labelled like
`bucketed+powersgd`; or those named with --methods), and a baseline that does not sync at
all, gets its own replica of the model (the methods that average models, localsgd and
diloco, average once per step here: their rows are the cost of one average, which
training pays every --period steps and `python -m mpi_train predict` divides by it); a
method the backend cannot run is listed as unavailable with the reason. Each step runs
forward + backward + sync once per method, round-robin with the starting method rotated, so
a burst of machine noise hits them all alike. Per method it reports:

- compute: forward + backward under --precision, as the job computes them (forward and loss
  under autocast to bfloat16 or float16; 16-mixed's loss scale, one multiply, left out); for
  methods that communicate inside backward, like ddp, this includes the communication they
  could not hide;
- sync: the sync call alone, timed between two barriers so no rank's lateness is counted.
  For a method that overlaps backward (ddp, bucketed) there is no barrier between
  backward and sync: Gloo's barrier waits for every collective in flight, so it would swallow
  the very communication the method overlaps; its sync is then the wait for what backward
  could not hide, and any rank's lateness with it;
- exposed: step time minus the no-sync baseline's step time in the same round, i.e. the
  communication the step really pays (with what its sends and compression cost backward);
- after backward: for a method that overlaps backward and waits in its sync (bucketed, zero,
  not ddp's), the sync of the rank that finished backward last: what backward did not hide,
  measured within one step;
- bytes sent/received per rank from the method's collective family (mpi_train/netmodel/families.py), for S
  as the method sends it (half the gradients' bytes for fp16/bf16, PowerSGD's factors);
- bus bandwidth S/t·2(N-1)/N and the floor the cost model allows on a link of bandwidth B,
  where B is the calibrated link the method's traffic crosses (between hosts when the job
  spans hosts);
- efficiency = floor / sync time, at most 1; n/a for methods that overlap backward (ddp,
  bucketed), whose communication time cannot be told apart from backward's;
- predicted: the alpha-beta model's sync time (mpi_train/netmodel/), plus a compressed
  method's codec time after backward (below), to hold against the measured sync time, or
  for an overlapped method the time after backward (ddp's: the exposed time); for the
  latter, its buckets leave when their gradients are ready, as measured on the no-sync
  baseline (hooks time each gradient's arrival in backward, on every rank; the medians are
  kept under "backward" in the JSON);
- codec: a compressed method's own CPU work per step (casts, PowerSGD's products and
  residuals), timed in its synced steps between its sums (the codec intervals of a
  timeline), after backward and inside it apart: the model charges only the wire, so the
  bench adds the measured CPU time after backward to its prediction (the work inside
  backward lengthens backward, as a timeline shows). An overlapped method's sync runs
  its buckets' work between their sums, one bucket's while another's is on the wire: there
  each interval is placed where it runs (netmodel.with_codec), not added after the wire.

Calibration first: ping-pong between rank 0 and a rank on its host and one on another host,
and allreduce, reduce-scatter and all-gather over all ranks, over message sizes from 1 KB to
S, fitted by least squares to alpha + beta·m (kept in the JSON under "calibration", with the
fit errors; `--calibration` of a training job and of `python -m mpi_train predict` reads it
from there: the links, and the reduce-scatter and all-gather as this backend runs them, which
price the sharded methods' collectives instead of a ring's bytes).

Medians over the timed steps (after warm-up), of the slowest rank in each step. The
table goes to stdout, --json writes every figure with the precision it measured under
("precision": what `python -m mpi_train predict --calibration` holds a job against), and rank
0 logs a run to MLflow (tag mpi_train.role = bench) unless --no-tracking.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .. import netmodel, tracking
from ..clock import Clock
from ..cluster import Cluster, GroupChannel
from ..config import (
    BACKENDS,
    ENV_DEFAULTS,
    LAUNCHERS,
    TrainConfig,
    add_config_arguments,
    add_model_arguments,
    model_config,
    model_flags,
)
from ..data import synthetic_batch
from ..devices import place
from ..errors import UserError
from ..files import write_json_atomically
from ..netmodel.families import bus_bandwidth, family_of
from ..rankguard import RankAwareParser, guarded, join_job
from ..step.precision import PRECISIONS, UNNAMED_PRECISION, agreed
from ..sync import SYNC_METHODS, SyncMethod, backend_error, parse_labels, split_label
from ..sync.messages import BUCKETS
from ..sync.ring import ring_reduce_scatter
from ..sync.zero import all_gather_single, reduce_scatter_single
from ..timeline import Recorder
from ..tracking import names as metric_names
from ..tracking.links import share_views, where

NO_SYNC = "no-sync"  # the baseline: backward only; every method's exposed communication is measured against it
ALLREDUCE_FIT = netmodel.ALLREDUCE  # the calibration's fit of torch's all_reduce (a bench JSON key, not a method)
# every collective the calibration fits, each under its own key (the sharded families price theirs from these; zero's
# own ring reduce-scatter on Gloo only, where zero runs it: sync/zero.py), called on a whole buffer and this rank's 1/N
CALIBRATED_COLLECTIVES = {
    ALLREDUCE_FIT: lambda whole, shard: dist.all_reduce(whole),
    netmodel.REDUCE_SCATTER: lambda whole, shard: reduce_scatter_single(shard, whole),
    netmodel.ALL_GATHER: lambda whole, shard: all_gather_single(whole, shard),
    netmodel.RING_REDUCE_SCATTER: lambda whole, shard: ring_reduce_scatter(whole, shard),
}
COLUMNS = ("method", "family", "S_MB", "compute_ms", "sync_ms", "exposed_ms", "±ms", "after_bwd_ms", "sent_MB",
           "recv_MB", "busbw_GB/s", "floor_ms", "efficiency", "predicted_ms", "pred_err", "codec_ms", "codec_bwd_ms")


class NoSync(SyncMethod):
    """Leaves the gradients as they are: the step a method would take if communication were free."""

    def sync(self, model: nn.Module) -> None:
        pass


@dataclass
class Contender:
    name: str
    method: SyncMethod
    model: nn.Module  # its own replica: a method may hook into its model's backward
    net: nn.Module
    overlapped: bool = False  # sends during backward: sync() waits for what is still in flight


class CodecClock(Recorder):
    """Adds up a compressor's work between its sums, the codec intervals a timeline draws: its CPU time as the
    synced step pays it (sharing the cores with the other ranks, and with backward for a method that compresses
    in backward)."""

    detailed = True  # the methods note their codec intervals only for a recorder that wants them
    wants_messages = False

    def __init__(self):
        self.seconds, self.intervals = 0.0, []

    def codec(self, start: float, end: float, bucket: int | None = None) -> None:
        self.seconds += end - start
        self.intervals.append(end - start)

    def take(self) -> tuple[float, list[float]]:
        """The seconds since the last take, in all and interval by interval."""
        taken = self.seconds, self.intervals
        self.seconds, self.intervals = 0.0, []
        return taken


class BackwardClock:
    """When each gradient of a model is ready during backward (hooks on its parameters), as shares of backward:
    what an overlapped method's buckets wait for, measured instead of assumed (netmodel.Backward)."""

    def __init__(self, model: nn.Module, now: Clock):
        self.now, self.ready_at, self.shares, self.order = now, {}, [], None
        self.params = [p for p in model.parameters() if p.requires_grad]
        for index, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(self.hook(index))

    def hook(self, index: int):
        def ready(_param) -> None:
            self.ready_at[index] = self.now()
        return ready

    def record(self, start: float, end: float) -> None:
        """One timed backward from `start` to `end`: each gradient's share of it."""
        length = max(end - start, 1e-9)
        self.shares.append([min(1.0, max(0.0, (self.ready_at.get(i, end) - start) / length))
                            for i in range(len(self.params))])
        if self.order is None:  # autograd's order, as it came (ready times of one node's tensors can tie)
            self.order = tuple(self.ready_at)
        self.ready_at.clear()

    def profile(self, share: float) -> netmodel.Backward:
        """The median share per gradient over the recorded steps, with backward's `share` of compute, and the order
        the gradients came in."""
        return netmodel.Backward(share, tuple(statistics.median(column) for column in zip(*self.shares)), self.order)


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    parser = RankAwareParser(prog="python -m mpi_train bench", quiet=quiet, description=__doc__.split("\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=256,
                        help="global batch of synthetic samples shaped for the model (images, or sequences of gpt's "
                             "context), split across ranks (default: 256)")
    add_config_arguments(parser, ("precision",))  # the job's: forward and backward are timed as it computes them
    parser.add_argument("--steps", type=int, default=20, help="timed steps per method (default: 20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per method first (default: 2)")
    parser.add_argument("--json", metavar="PATH", help="rank 0 writes every figure here")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="auto",
                        help="what started the ranks (default: auto, detected)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="process-group backend (default: auto)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads per rank (default: this host's cores divided by its ranks)")
    parser.add_argument("--bucket-mb", type=float, default=TrainConfig.bucket_mb,
                        help=f"bucket size for the bucketed method (default: {TrainConfig.bucket_mb:g})")
    parser.add_argument("--methods", help="comma-separated methods to measure, as labelled in the table, e.g. "
                        "ddp,bucketed,bucketed+powersgd (default: every method with every compression it carries)")
    parser.add_argument("--powersgd-rank", type=int, default=TrainConfig.powersgd_rank,
                        help=f"rank of PowerSGD's factors (default: {TrainConfig.powersgd_rank}); "
                             f"it compresses from the first step here")
    parser.add_argument("--link-iters", type=int, default=3,
                        help="timed repetitions per message size of the link calibration (default: 3)")
    parser.add_argument("--link", help="the link rate the hosts were shaped to (e.g. 1gbit): recorded, and the "
                                       "calibrated inter-host bandwidth is capped at it")
    parser.add_argument("--master-addr", default=None, help="rendezvous address (default: $MASTER_ADDR, else chosen)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a collective may wait (default: 300)")
    parser.add_argument("--tracking-uri", help="MLflow server or database (default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db)")
    parser.add_argument("--experiment", default="mpi_train",
                        help="MLflow experiment the benchmark run is filed under (default: mpi_train)")
    parser.add_argument("--run-name", help="name of the benchmark run (default: bench-MODEL-npN)")
    parser.add_argument("--no-tracking", action="store_true", help="do not record the benchmark in MLflow")
    return parser


def validate(args: argparse.Namespace, world: int) -> None:
    for flag, value in {"--batch-size": args.batch_size, "--steps": args.steps, "--link-iters": args.link_iters,
                        "--timeout": args.timeout}.items():
        if value <= 0:
            raise UserError(f"{flag} must be positive, got {value}.")
    if args.warmup < 0:
        raise UserError(f"--warmup must not be negative, got {args.warmup}.")
    if args.bucket_mb <= 0:
        raise UserError(f"--bucket-mb must be positive, got {args.bucket_mb}.")
    if args.powersgd_rank <= 0:
        raise UserError(f"--powersgd-rank must be positive, got {args.powersgd_rank}.")
    parse_labels(args.methods)
    if args.link:
        try:
            netmodel.rate_bytes_per_s(args.link)
        except ValueError as error:
            raise UserError(f"--link: {error}.") from None
    if args.batch_size % world:
        raise UserError(f"--batch-size {args.batch_size} is the global batch and must split evenly across the {world} "
                        f"ranks. Use a multiple of {world}.")


# ---------------------------------------------------------------------------------------------

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


def configured(text: str, bucket_mb: float, powersgd_rank: int = TrainConfig.powersgd_rank) -> SyncMethod:
    """The method a label names, as the bench runs it: PowerSGD compresses from the first step (the steady state is
    measured)."""
    if text == NO_SYNC:
        return NoSync()
    name, compression = split_label(text)
    config = TrainConfig(sync=name, compression=compression, bucket_mb=bucket_mb, powersgd_rank=powersgd_rank,
                         powersgd_start_step=0, period=1)  # a model-averaging method: one average a step, its cost
    return SYNC_METHODS[name].from_config(config)


def contenders(workload: TrainConfig, device: torch.device, bucket_mb: float, labels: list[str] | None = None,
               backend: str = "gloo",
               powersgd_rank: int = TrainConfig.powersgd_rank) -> tuple[list[Contender], list[tuple[str, str]]]:
    """The no-sync baseline and each method, each with an identical replica of the model `workload` names; and the
    methods the backend cannot run, with the reason."""
    torch.manual_seed(0)
    template = workload.make_model().to(device)
    entries, unavailable = [], []
    for text in [NO_SYNC, *(labels or parse_labels(None))]:
        refused = backend_error(split_label(text)[0], backend) if text != NO_SYNC else None
        if refused:
            unavailable.append((text, refused))
            continue
        model = copy.deepcopy(template)
        method = configured(text, bucket_mb, powersgd_rank)
        entries.append(Contender(text, method, model, method.wrap(model), method.overlapped()))
    return entries, unavailable


def measure(entries: list[Contender], images: torch.Tensor, labels: torch.Tensor, steps: int, warmup: int,
            device: torch.device, progress,
            precision: str = "32-true") -> tuple[dict[str, dict[str, list[float]]], tuple[int, ...] | None]:
    """Per method, this rank's compute (and its backward), sync and whole-step seconds for each timed step, methods
    interleaved round-robin, and when the no-sync baseline's gradients became ready during its backward (its
    "ready": pooled_backward makes every rank's one profile), with the order they came in. A step runs from one
    barrier to the next, so its time is the slowest rank's on every rank. Forward and loss run under autocast to
    `precision`'s dtype (a resolved --precision), as the job's step runs them."""
    now = Clock(device)
    computing = PRECISIONS[precision]
    times = {entry.name: {"compute": [], "backward": [], "sync": [], "step": []} for entry in entries}
    codecs = {}
    for entry in entries:  # DDP's compression runs in torch's hooks, out of sight
        if entry.method.compressor.name != "none" and not entry.method.inside_ddp():
            codecs[entry.name] = CodecClock()
            entry.method.record_into(codecs[entry.name])
            # after backward (in all, and each interval in the order sync() ran them), and inside backward
            times[entry.name].update(codec=[], codec_intervals=[], codec_backward=[])
    clock = BackwardClock(entries[0].model, now)  # the no-sync baseline: nothing else runs in its backward
    total = warmup + steps
    for step in range(total):
        shift = step % len(entries)
        for entry in entries[shift:] + entries[:shift]:  # a different method goes first each step
            dist.barrier()
            t0 = now()
            entry.model.zero_grad(set_to_none=True)
            with computing.autocast(device):
                loss = F.cross_entropy(entry.net(images), labels)
            forward_end = now()
            loss.backward()
            t1 = now()
            in_backward = codecs[entry.name].take()[0] if entry.name in codecs else 0.0
            if entry.name == NO_SYNC and step >= warmup:
                clock.record(forward_end, t1)
            if not entry.overlapped:  # (a barrier would also wait for an overlapped method's sends in flight)
                dist.barrier()  # sync starts with every rank ready, so lateness is not counted as sync
            t2 = now()
            entry.method.sync(entry.model)
            entry.method.after_step(entry.model)  # (a model-averaging method averages here: no optimizer step)
            dist.barrier()
            t3 = now()
            if step >= warmup:
                times[entry.name]["compute"].append(t1 - t0)
                times[entry.name]["backward"].append(t1 - forward_end)
                times[entry.name]["sync"].append(t3 - t2)
                times[entry.name]["step"].append(t3 - t0)
            if entry.name in codecs:
                codec_s, intervals = codecs[entry.name].take()
                if step >= warmup:
                    times[entry.name]["codec"].append(codec_s)
                    times[entry.name]["codec_backward"].append(in_backward)
                    times[entry.name]["codec_intervals"].append(intervals)
        progress(step + 1, total, step < warmup)
    times[NO_SYNC]["ready"] = clock.shares  # (every rank's, pooled by pooled_backward)
    return times, clock.order


def pooled_backward(per_rank: list[dict], order: tuple[int, ...] | None) -> netmodel.Backward:
    """The backward profile over every rank's timed no-sync steps (measure() keeps each rank's under "ready"): the
    median share per gradient and backward's median share of compute. With ranks sharing cores one rank's few
    steps are not enough: between two benches rank 0 alone put VGG-11's first 27 MB bucket ready at 85% and at 91%
    of backward, and zero's predicted wire time at 1 Gbit/s moved threefold with it."""
    baseline = [rank[NO_SYNC] for rank in per_rank]
    steps = [shares for rank in baseline for shares in rank.get("ready", [])]
    fractions = [b / c for rank in baseline for b, c in zip(rank["backward"], rank["compute"]) if c > 0]
    if not steps or not fractions:
        return netmodel.ASSUMED_BACKWARD
    return netmodel.Backward(statistics.median(fractions), tuple(statistics.median(column) for column in zip(*steps)),
                             order)


def last_to_finish_backward(per_rank: list[dict], name: str) -> list[int]:
    """Each timed step's rank whose forward and backward of method `name` took longest: every rank starts the step
    at the same barrier, so it is the last to finish backward."""
    return [max(range(len(per_rank)), key=computes.__getitem__)
            for computes in zip(*(rank[name]["compute"] for rank in per_rank))]


def after_last_backward(per_rank: list[dict], name: str) -> list[float]:
    """Each timed step's sync seconds of method `name` on the rank that finished backward last: the communication
    its backward did not hide, with no wait for a later rank in it. For an overlapped method this is the exposed
    communication measured within one step, not as the difference of two steps' times, whose noise on shared
    cores (±50 to ±300 ms on a 2 s step) can exceed a compressed method's whole sync."""
    return [per_rank[rank][name]["sync"][step] for step, rank in enumerate(last_to_finish_backward(per_rank, name))]


def codec_after_backward(per_rank: list[dict], name: str) -> list[float] | None:
    """Each of method `name`'s codec intervals after backward, in the order its sync() ran them: in each step the
    slowest rank's (each sum that follows waits for every rank's work), then the median over steps; None where
    ranks or steps ran different numbers of them."""
    steps = [list(ranks) for ranks in zip(*(rank[name]["codec_intervals"] for rank in per_rank))]
    if not steps or len({len(intervals) for ranks in steps for intervals in ranks}) != 1:
        return None
    slowest_each = [[max(column) for column in zip(*ranks)] for ranks in steps]
    return [statistics.median(column) for column in zip(*slowest_each)]


def spread(values: list[float]) -> float:
    """Half the interquartile range: how far a typical step's figure strays from the median on this machine."""
    if len(values) < 4:
        return float("nan")
    quartiles = statistics.quantiles(values, n=4)
    return (quartiles[2] - quartiles[0]) / 2


def slowest(per_rank: list[dict], name: str, phase: str) -> list[float]:
    """Each timed step's `phase` seconds of method `name` on the rank that took longest in it."""
    return [max(values) for values in zip(*(rank[name][phase] for rank in per_rank))]


def summarise(per_rank: list[dict], gradient_bytes: int, world: int, bandwidth: float,
              sent: dict[str, float] | None = None, hosts: tuple[str, ...] | None = None,
              model_of: ModelInputs | None = None, later: dict[str, float] | None = None) -> list[dict]:
    """One row per method: medians over steps of the slowest rank, bytes and floor from its collective family, and
    the alpha-beta model's prediction when `model_of` gives the links, layout and tensor sizes.

    `sent` is S per method label as it sends it (default: the gradients' bytes in its wire dtype); `hosts` each
    rank's host, for the families that depend on placement; `later` the share of S each method sums after its
    first round (SyncMethod.later_share: PowerSGD's Qs). A compressed method's codec is the median over steps of
    the slowest rank's."""
    names = list(per_rank[0])
    bucket_mb = model_of.bucket_mb if model_of else TrainConfig.bucket_mb

    # The step from barrier to barrier, not the slowest compute plus the slowest sync: where no barrier parts them
    # (overlapped methods), the rank that finishes backward first waits longest in sync, and that sum counts both.
    steps = {name: slowest(per_rank, name, "step") for name in names}
    rows = []
    for name in names:
        method = configured(name, bucket_mb)
        compute = statistics.median(slowest(per_rank, name, "compute"))
        sync = statistics.median(slowest(per_rank, name, "sync"))
        differences = [s - b for s, b in zip(steps[name], steps[NO_SYNC])]
        exposed = statistics.median(differences)
        codec = statistics.median(slowest(per_rank, name, "codec")) if "codec" in per_rank[0][name] else None
        codec_backward = (statistics.median(slowest(per_rank, name, "codec_backward"))
                          if "codec_backward" in per_rank[0][name] else None)
        # an overlapped method's own wait (ddp's is inside backward, so not in its sync: none)
        tails = (after_last_backward(per_rank, name)
                 if name != NO_SYNC and method.overlapped() and not method.inside_ddp() else None)
        after_backward = statistics.median(tails) if tails else None
        row = {"method": name, "compute_s": compute, "sync_s": sync, "step_s": statistics.median(steps[name]),
               "exposed_s": exposed, "noise_s": spread(differences), "after_backward_s": after_backward,
               "after_backward_noise_s": spread(tails) if tails else None,
               "collective": None, "wire_bytes": None, "sent_bytes": None, "received_bytes": None,
               "busbw_bytes_per_s": None, "floor_s": None, "efficiency": None, "codec_s": codec,
               "codec_backward_s": codec_backward}
        family = None if name == NO_SYNC else family_of(method)
        ratio = sent[name] / gradient_bytes if sent and name in sent else None  # what its compressor sends
        if family is not None:
            overlapped = method.overlapped()
            comm = None if overlapped else sync
            size = gradient_bytes * ratio if ratio is not None else gradient_bytes * (
                method.wire_dtype.itemsize / 4 if method.wire_dtype is not None else 1.0)
            traffic = [family.traffic(size, world, rank, hosts) for rank in range(world)]
            floor = family.floor(size, world, bandwidth, hosts) if world > 1 else 0.0
            row.update({
                "collective": family.name, "comm_s": comm, "overlapped": overlapped, "wire_bytes": size,
                "sent_bytes": [sent_ for sent_, _ in traffic], "received_bytes": [received for _, received in traffic],
                "busbw_bytes_per_s": bus_bandwidth(size, world, comm) if world > 1 and comm else None,
                # an overlapped method's communication hides in backward: no time to hold the floor against (n/a)
                "floor_s": floor, "efficiency": min(1.0, floor / comm) if world > 1 and comm else None,
            })
        if model_of is not None and name != NO_SYNC:
            backward = model_of.backward.share * statistics.median(slowest(per_rank, NO_SYNC, "compute"))
            prediction = netmodel.predict(method, model_of.tensor_bytes, model_of.layout, model_of.network, label=name,
                                          ratio=ratio, backward_s=backward, backward=model_of.backward,
                                          units=model_of.units, later=(later or {}).get(name, 0.0),
                                          step_ends_at_barrier=True)  # (zero's all-gathers are waited for there)
            if prediction is not None:
                measured = (sync if not prediction.overlapped else
                            after_backward if after_backward is not None else exposed)
                # the wire, plus the compressor's CPU after backward, timed here (what it does in backward lengthens
                # backward, the step's compute): where each bucket's work runs between its sums, placed there
                predicted = prediction.sync_s + (row["codec_s"] or 0.0)
                intervals = (codec_after_backward(per_rank, name)
                             if after_backward is not None and "codec_intervals" in per_rank[0][name] else None)
                placed = codec_placed(prediction, backward, intervals)
                if placed is not None:
                    predicted = placed
                row.update({"predicted_s": predicted, "predicted_comm_s": prediction.comm_s,
                            "codec_placed": placed is not None,  # (its intervals, each a median over steps)
                            "codec_intervals_s": intervals if placed is not None else None,
                            "measured_s": measured, "messages": prediction.messages,
                            "prediction_error": (predicted - measured) / measured if measured > 0 else None})
        rows.append(row)
    return rows


def codec_placed(prediction: netmodel.Prediction, backward_s: float, codec: list[float] | None) -> float | None:
    """An overlapped method's predicted sync with its codec intervals after backward placed between its sums, as
    its sync() runs them (netmodel.with_codec), instead of added after the wire; None where they do not fit."""
    exposed = netmodel.with_codec(prediction.plan, backward_s, codec) if codec else None
    if exposed is None:
        return None
    return prediction.sync_s - max(0.0, prediction.plan[-1].end_s - backward_s) + exposed


@dataclass(frozen=True)
class ModelInputs:
    """What the alpha-beta model needs to predict a method's sync in this benchmark."""

    network: netmodel.Network
    layout: netmodel.Layout
    tensor_bytes: tuple
    bucket_mb: float
    backward: netmodel.Backward = netmodel.ASSUMED_BACKWARD  # when its gradients are ready, measured on no-sync
    units: tuple | None = None  # each tensor's layer block (netmodel.tensor_units): fsdp's messages


def format_table(rows: list[dict]) -> str:
    def cell(row: dict, column: str) -> str:
        scale = {"compute_ms": ("compute_s", 1e3), "sync_ms": ("sync_s", 1e3), "exposed_ms": ("exposed_s", 1e3),
                 "±ms": ("noise_s", 1e3), "floor_ms": ("floor_s", 1e3), "busbw_GB/s": ("busbw_bytes_per_s", 1e-9),
                 "efficiency": ("efficiency", 1), "predicted_ms": ("predicted_s", 1e3),
                 "pred_err": ("prediction_error", 100), "codec_ms": ("codec_s", 1e3),
                 "after_bwd_ms": ("after_backward_s", 1e3), "codec_bwd_ms": ("codec_backward_s", 1e3)}
        if column == "method":
            return row["method"]
        if column == "family":
            return row["collective"] or ("-" if row["method"] == NO_SYNC else "n/a")
        if column == "S_MB":
            return "-" if row.get("wire_bytes") is None else f"{row['wire_bytes'] / 1e6:.2f}"
        if column in ("sent_MB", "recv_MB"):
            values = row["sent_bytes" if column == "sent_MB" else "received_bytes"]
            if values is None:
                return "-"
            low, high = min(values) / 1e6, max(values) / 1e6  # rank 0 may move more than the rest
            digits = 1 if high >= 10 else 2
            if math.isclose(low, high):
                return f"{high:.{digits}f}"
            return f"{high:.{digits}f} ({'r0' if values[0] == high else 'max'}) / {low:.{digits}f}"
        key, factor = scale[column]
        value = row.get(key)
        if column == "efficiency" and row.get("overlapped"):
            return "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        if column == "pred_err":
            return f"{value * factor:+.0f}%"
        noise = row.get("after_backward_noise_s") if column == "after_bwd_ms" else None
        if noise is not None and math.isfinite(noise):
            return f"{value * factor:.1f} ±{noise * factor:.1f}"
        return f"{value * factor:.2f}" if column in ("efficiency", "busbw_GB/s") else f"{value * factor:.1f}"

    cells = [list(COLUMNS)] + [[cell(row, c) for c in COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def describe(result: dict) -> str:
    """The table with the setting above it and notes under it, as printed and stored."""
    link = result["link"]
    calibration = result.get("calibration")
    layout = result.get("layout")
    lines = [
        f"sync cost: {result['world_size']} rank(s)"
        + (f" on {layout['hosts']} host(s), {layout['ranks_per_host']} per host" if layout else "")
        + (f", link {result['network_link']}" if result.get("network_link") else "")
        + f", backend {result['backend']}, {result.get('precision', UNNAMED_PRECISION)}, "
        f"{result.get('model_described', result['model'])} "
        f"({result['gradient_bytes'] / 1e6:.1f} MB of gradients), batch {result['batch_size']}, "
        f"{result['steps']} timed steps per method (medians, slowest rank per step)",
        f"link bandwidth B = {link['bandwidth_bytes_per_s'] / 1e9:.3f} GB/s "
        f"({link.get('measured_by', 'ping-pong rank 0 <-> 1')}); "
        f"allreduce bus bandwidth {link['allreduce_busbw_bytes_per_s'] / 1e9:.3f} GB/s"
        if result["world_size"] > 1 else "one rank: no link to measure, floors are zero",
    ]
    if calibration:
        lines.append("calibration (alpha + beta·m, least squares over 1 KB .. S): "
                     + netmodel.describe_network(netmodel.Network.from_dict(calibration["network"])))
        for name in CALIBRATED_COLLECTIVES:
            fit = calibration.get(name)
            if fit:
                lines.append(f"{name} of m bytes on all {result['world_size']} ranks: {fit['alpha'] * 1e3:.2f} ms + "
                             f"m / {1 / fit['beta'] / 1e6 if fit['beta'] else math.inf:,.0f} MB/s "
                             f"(fit error {100 * fit['fit_error']:.0f}%)")
    lines.append(format_table(result["methods"]))
    missing = [row["method"] for row in result["methods"] if row["method"] != NO_SYNC and row["collective"] is None]
    if missing:
        lines.append(f"n/a: {', '.join(missing)} declare(s) no collective family (mpi_train/netmodel/families.py), "
                     f"so bytes and floor are not shown; set `collective` on the class in mpi_train/sync/.")
    for name, why in result.get("unavailable", []):
        lines.append(f"unavailable: {name}: {why}")
    lines.append("S = bytes summed per step as the method sends them (cost model's S); "
                 "exposed = step minus the no-sync step in the same round (± half its interquartile range over steps: "
                 "the machine's noise); after_bwd = an overlapped method's sync on the rank that finished backward "
                 "last (what its backward did not hide, ± as for exposed; none for ddp's, which wait inside "
                 "backward); "
                 "efficiency = floor / sync (at most 1; n/a where communication overlaps backward); predicted = the "
                 "alpha-beta model's wire time (mpi_train/netmodel/) plus codec (an overlapped method's placed "
                 "between its sums, as its sync runs it), pred_err against sync, against "
                 "after_bwd for overlapped methods (exposed for ddp's); codec = the compressor's own CPU work per "
                 "step after backward, codec_bwd its work inside backward (which lengthens compute).")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------

def method_params(row: dict, result: dict) -> dict:
    """A method's child run params: what it is and where it ran, the same keys on every child."""
    name, compression = split_label(row["method"])
    layout = result.get("layout") or {}
    method = configured(row["method"], result.get("bucket_mb", TrainConfig.bucket_mb))
    bucket = method.bucket_caps()[1] / 2**20 if method.messages == BUCKETS else None
    return {"sync": name, "compression": compression, "bucket_mb": f"{bucket:g}" if bucket else "-",
            "collective": row.get("collective") or "-", "link": result.get("network_link") or "unlimited",
            "num_hosts": layout.get("hosts", 1), "ranks_per_host": layout.get("ranks_per_host", result["world_size"]),
            "world_size": result["world_size"], "model": result["model"], "batch_size": result["batch_size"]}


def method_metrics(row: dict) -> dict:
    """A method's figures under the same `bench/` keys on every child run (tracking/names.py), so one chart per
    figure holds every method."""
    sent = max(row["sent_bytes"]) / 1e6 if row.get("sent_bytes") else None
    figures = {"step_s": row["step_s"], "compute_s": row["compute_s"], "sync_s": row["sync_s"],
               "exposed_s": row["exposed_s"], "predicted_s": row.get("predicted_s"),
               "prediction_error": row.get("prediction_error"), "sent_mb": sent, "codec_s": row.get("codec_s"),
               "codec_backward_s": row.get("codec_backward_s"), "after_backward_s": row.get("after_backward_s"),
               "efficiency": row.get("efficiency")}
    return {metric_names.bench_key(key): float(value) for key, value in figures.items()
            if isinstance(value, (int, float)) and math.isfinite(value)}


def log_run(connection: tracking.Connection, run_name: str, result: dict, text: str) -> str:
    """Rank 0: the bench as a parent run (its setting as params, the JSON and the table as artifacts) with one child
    run per method label, so MLflow's chart view compares the methods side by side."""
    from mlflow.entities import Param

    client, experiment = connection.client, connection.experiment_id
    run_id = client.create_run(experiment, run_name=run_name, tags={"mpi_train.role": "bench"}).info.run_id
    children = []
    try:
        params = {key: result[key] for key in ("world_size", "backend", "model", "batch_size", "steps", "warmup",
                                               "gradient_bytes", "precision")}
        layout = result.get("layout") or {}
        params.update(link=result.get("network_link") or "unlimited", num_hosts=layout.get("hosts", 1),
                      ranks_per_host=layout.get("ranks_per_host", result["world_size"]))
        client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()], synchronous=True)
        client.log_dict(run_id, result, "bench.json")
        client.log_text(run_id, text + "\n", "bench.txt")
        setting = f"np{result['world_size']}" + (f"-h{layout['hosts']}-{result['network_link']}"
                                                 if result.get("network_link") else "")
        stamp = int(time.time() * 1000)
        for row in result["methods"]:
            children.append(log_child(client, experiment, run_id, f"{row['method']}-{setting}", "bench_method",
                                      method_metrics(row), method_params(row, result), stamp))
    except BaseException:
        for failed in [*children, run_id]:
            client.set_terminated(failed, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    share_views(client, experiment)
    return run_id


def log_child(client, experiment: str, parent_id: str, name: str, role: str, metrics: dict, params: dict,
              stamp: int) -> str:
    """One child run of `parent_id` (a bench's method, an advice's candidate) with its metrics and params, ended
    FINISHED (FAILED if logging them fails); its id."""
    from mlflow.entities import Metric, Param

    child = client.create_run(experiment, run_name=name, tags={"mlflow.parentRunId": parent_id,
                                                               "mpi_train.role": role}).info.run_id
    try:
        client.log_batch(child, metrics=[Metric(k, float(v), stamp, 0) for k, v in metrics.items()],
                         params=[Param(k, str(v)) for k, v in params.items()], synchronous=True)
    except BaseException:
        client.set_terminated(child, "FAILED")
        raise
    client.set_terminated(child, "FINISHED")
    return child


def run(cluster: Cluster, args: argparse.Namespace) -> None:
    info = cluster.info
    world = info.world_size
    validate(args, world)
    uri = args.tracking_uri or os.environ.get(ENV_DEFAULTS["tracking_uri"]) or None
    settings = model_config(args, batch_size=args.batch_size, tracking_uri=uri, experiment=args.experiment,
                            no_tracking=args.no_tracking)
    connection = tracking.connect(settings, cluster)  # rank 0 checks the store before any work
    placement = place(cluster, args.backend, args.threads)
    backend, threads, device = placement.backend, placement.threads, placement.device
    precision = agreed(args.precision, device, cluster).name  # auto: what the job would run here
    cluster.open_process_group(backend, args.master_addr, args.timeout, device)

    entries, unavailable = contenders(settings, device, args.bucket_mb, parse_labels(args.methods), backend,
                                      args.powersgd_rank)
    gradient_bytes = sum(p.numel() * p.element_size() for p in entries[0].model.parameters() if p.requires_grad)
    sent = {entry.name: entry.method.wire_bytes(list(entry.model.parameters())) for entry in entries[1:]}
    later = {entry.name: entry.method.later_share(list(entry.model.parameters())) for entry in entries[1:]}
    link = {"bandwidth_bytes_per_s": None, "allreduce_busbw_bytes_per_s": None}  # one rank has no link
    layout = netmodel.Layout.of_hosts(list(cluster.hosts))
    calibration = None
    if world > 1:
        if info.is_main:
            print(f"bench: calibrating the links (ping-pong; allreduce, reduce-scatter and all-gather, 1 KB .. "
                  f"{gradient_bytes / 1e6:.1f} MB)",
                  flush=True)
        calibration = netmodel.calibrate(cluster.hosts, gradient_bytes, args.link_iters, device, args.link)
        fits = {name: collective_calibration(name, gradient_bytes, args.link_iters, device)
                for name in CALIBRATED_COLLECTIVES if name != netmodel.RING_REDUCE_SCATTER or backend == "gloo"}
        if info.is_main:
            calibration.update(fits)
            network = netmodel.capped(netmodel.Network.from_dict(calibration["network"]), args.link)
            calibration["network"] = network.as_dict()
            crossed = network.slowest if layout.hosts > 1 else network.intra
            link["bandwidth_bytes_per_s"] = crossed.bandwidth
            link["measured_by"] = crossed.source + (", between hosts" if layout.hosts > 1 else ", on one host")
        whole = fits[ALLREDUCE_FIT]  # its largest buffer, the gradients' size: the allreduce as training meets it
        link["allreduce_busbw_bytes_per_s"] = bus_bandwidth(whole["sizes"][-1], world, whole["seconds"][-1])

    images, labels = (part.to(device) for part in synthetic_batch(settings, args.batch_size // world))
    for entry in entries:
        entry.model.train()

    def progress(step: int, total: int, warming: bool) -> None:
        if info.is_main:
            print(f"bench step {step:>4}/{total}{'  (warm-up)' if warming else ''}", flush=True)

    if info.is_main:
        print(f"bench: {world} rank(s), {threads} thread(s) each, {precision}, methods "
              f"{', '.join(e.name for e in entries)}", flush=True)
    times, order = measure(entries, images, labels, args.steps, args.warmup, device, progress, precision)
    per_rank = cluster.gather(times)
    dist.destroy_process_group()
    if not info.is_main:
        return
    backward = pooled_backward(per_rank, order)
    inputs = None
    if calibration:
        calibration["backward"] = backward.as_dict()  # a training job's or predict's --calibration reads it
        network = netmodel.with_collective_costs(netmodel.Network.from_dict(calibration["network"]), calibration,
                                                 layout)  # the sharded collectives priced as they ran here
        inputs = ModelInputs(network, layout,
                             tuple(netmodel.tensor_sizes(entries[0].model)), args.bucket_mb, backward,
                             tuple(netmodel.tensor_units(entries[0].model)))
    result = {
        "world_size": world, "backend": backend, "model": args.model, "model_described": settings.describe_model(),
        "precision": precision,
        "model_flags": model_flags(args), "batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup,
        "threads": threads, "gradient_bytes": gradient_bytes,
        "link": link, "hosts": list(cluster.hosts), "unavailable": unavailable,
        "layout": {"hosts": layout.hosts, "ranks_per_host": layout.ranks_per_host, "host_of_rank": list(cluster.hosts)},
        "network_link": args.link, "bucket_mb": args.bucket_mb, "calibration": calibration,
        "methods": summarise(per_rank, gradient_bytes, world, link["bandwidth_bytes_per_s"], sent, cluster.hosts,
                             inputs, later),
        "per_rank_times": per_rank,
    }
    text = describe(result)
    print(text, flush=True)
    if args.json:
        write_json_atomically(args.json, result)
        print(f"wrote {args.json}")
    if connection is not None:
        run_id = log_run(connection, args.run_name or f"bench-{args.model}-np{world}", result, text)
        print(f"logged as MLflow run {run_id} in experiment {args.experiment!r}, a child run per method; "
              + where(connection.uri, connection.experiment_id, run_id, charts=True), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    cluster = join_job(argv)
    args = build_parser(quiet=not cluster.info.is_main).parse_args(argv)
    return guarded(cluster, lambda: run(cluster, args))
