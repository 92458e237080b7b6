"""`python -m mpi_train predict`: each sync method's step time and memory per rank on a cluster you do not have.

    python -m mpi_train predict --model vgg11 --batch-size 256 --ranks 64 --ranks-per-host 8 --link 10gbit
    python -m mpi_train predict --model vgg11 --batch-size 256 --ranks 2,4,8,16,32,64,128,256 --ranks-per-host 8 \\
        --link 10gbit --calibration bench.json --plot scaling.png

Step time = compute (forward + backward per sample, measured, times the per-rank batch) +
the method's predicted exposed communication (mpi_train/netmodel/: all of it for a method
that syncs after backward, what outlasts backward for ddp and bucketed). Compute per sample
comes from --compute-per-sample, else from --calibration's no-sync baseline (timed in the
precision its bench ran: another --precision is refused), else from timing the model here in
--precision. Links: between hosts the --link rate with the calibration's (or an assumed)
latency; within a host the calibration's intra-host link, else an assumed loopback.
Scaling efficiency = compute / step time: how much of the ideal N-fold speed-up is left.

Beside the time, each method's memory per rank (netmodel/memory.py): the parameters, gradients
and optimizer state (--optimizer sgd: a momentum buffer per parameter, none with --momentum 0;
adamw: two moments) a rank holds, with what the method shards divided by N; and its
communication by collective, where it runs more than one (ZeRO's reduce-scatter and all-gather,
FSDP's gathers in forward and in backward).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import netmodel
from ..benchmark.clocks import BackwardClock
from ..clock import Clock
from ..config import TrainConfig, add_config_arguments, add_model_arguments, model_config, model_flags
from ..data import synthetic_batch
from ..errors import ArgumentParser, UserError, format_error
from ..files import kept, unwritable
from ..netmodel.memory import predict_memory
from ..optimizers import describe_state, state_slots
from ..step.precision import PRECISION_AUTO, PRECISIONS, UNNAMED_PRECISION, resolve
from ..sync import PARAMETERS, SYNC_METHODS, SyncMethod, build_method, parse_labels, split_label
from ..sync.bucketed import DEFAULT_BUCKET_MB
from .predict_flags import check_averaging, check_batch_splits, check_numbers, parse_ranks
from .predict_tables import (
    Row,
    cuda_only_overlaps,
    format_memory,
    format_memory_scaling,
    format_scaling,
    format_single,
    format_time_to_accuracy,
    overlap_verdicts,
    plot_scaling,
)

DEFAULT_PLOT = "predict_scaling.png"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m mpi_train predict", description=__doc__.split("\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=__doc__.split("\n\n", 1)[1])
    add_model_arguments(parser)  # the model whose gradients are synced, as training names it
    parser.add_argument("--batch-size", type=int, default=256,
                        help="global batch, split across the ranks (default: 256)")
    parser.add_argument("--per-rank-batch", type=float,
                        help="keep each rank's batch at this size instead (weak scaling); overrides --batch-size")
    parser.add_argument("--ranks", default="64",
                        help="number of ranks, or a comma-separated list for a scaling table (default: 64)")
    parser.add_argument("--ranks-per-host", type=int, default=8, help="ranks on each host (default: 8)")
    parser.add_argument("--link", help="rate of each host's link, e.g. 10gbit, 1gbit, 100mbit (default: the "
                                       "calibration's inter-host link)")
    parser.add_argument("--calibration", metavar="PATH",
                        help="a bench JSON (python -m mpi_train bench --json): fitted links and compute per sample")
    parser.add_argument("--compute-per-sample", type=float, metavar="SECONDS",
                        help="forward + backward seconds per sample on one rank (default: the calibration's, else "
                             "timed here)")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="bucket size of the bucketed method (default: 25)")
    parser.add_argument("--methods", help="comma-separated method labels to predict, e.g. ddp,localsgd+powersgd "
                                          "(default: every registered method, uncompressed)")
    parser.add_argument("--period", type=int, default=None, metavar="H",
                        help="localsgd and diloco: steps between two averages of the models (default: theirs, 8)")
    parser.add_argument("--host-period", type=int, default=None, metavar="STEPS",
                        help="localsgd and diloco: also average inside each host every this many steps (default: off)")
    # the job's: its optimizer's state is part of the memory per rank; its precision, of the compute per sample
    add_config_arguments(parser, ("optimizer", "precision"), helps={"precision": (
        "what the job's forward and backward compute in, by training's names: --calibration's bench must have "
        "timed its compute in it; timed here, the model runs in it on this machine's CPU (default: auto: the "
        "bench's, else what auto picks here)")})
    parser.add_argument("--momentum", type=float, default=None,
                        help="SGD momentum the memory per rank assumes: a buffer per parameter, none at 0 (default: "
                             "the model's, 0.9; --optimizer sgd only)")
    parser.add_argument("--overlap", action="store_true",
                        help="localsgd and diloco: each average sent in the background, hidden under the local steps "
                             "until the next one (exposed = max(0, transfer - their compute))")
    parser.add_argument("--fragments", type=int, default=None, metavar="F",
                        help="localsgd and diloco: one of F fragments of the model averaged every period/F steps")
    parser.add_argument("--steps-to-accuracy", metavar="METHOD=STEPS,...",
                        help="steps each method took to reach an accuracy (measured on any network: a report's time "
                             "to accuracy): adds each one's predicted time to that accuracy on this cluster")
    parser.add_argument("--plot", default=DEFAULT_PLOT,
                        help=f"with several --ranks: where the plot goes (default: {DEFAULT_PLOT})")
    return parser


def measured_compute(workload: TrainConfig, batch: int = 16, iters: int = 3,
                     precision: str = "32-true") -> tuple[float, netmodel.Backward]:
    """Forward + backward seconds per sample of the model on this machine (median of a few small batches), forward
    and loss under autocast to `precision`'s dtype as the job's step runs them, and when its backward had each
    gradient ready (as the bench measures it): the model's own profile, not an assumed one."""
    import torch  # here, not at the top: only timing the model needs torch's autograd running
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = workload.make_model()
    inputs, targets = synthetic_batch(workload, batch)
    cpu = torch.device("cpu")
    clock, seconds, shares = BackwardClock(model, Clock(cpu)), [], []
    for i in range(iters + 1):
        started = time.perf_counter()
        model.zero_grad(set_to_none=True)
        with PRECISIONS[precision].autocast(cpu):
            loss = F.cross_entropy(model(inputs), targets)
        forward_end = time.perf_counter()
        loss.backward()
        ended = time.perf_counter()
        if i:  # the first pass allocates
            seconds.append(ended - started)
            shares.append((ended - forward_end) / (ended - started))
            clock.record(forward_end, ended)
        else:
            clock.ready_at.clear()
    return statistics.median(seconds) / batch, clock.profile(statistics.median(shares))


def meta_model(workload: TrainConfig):
    """The model built on the meta device (shapes only: no memory, no compute): each gradient's bytes, what a
    compressor sends and what a rank holds come from the model itself."""
    import torch  # here, not at the top: as measured_compute

    with torch.device("meta"):
        return workload.make_model()


def compute_from_bench(bench: dict, path: str) -> float:
    """Seconds per sample of the bench's no-sync baseline (forward + backward on one rank's share of its batch); a
    UserError where the file holds none (an advice, whose links a job's --calibration reads, times no step)."""
    rows = bench.get("methods") if isinstance(bench.get("methods"), list) else []
    baseline = next((row for row in rows if isinstance(row, dict) and row.get("method") == "no-sync"), {})
    try:
        per_sample = baseline["compute_s"] / (bench["batch_size"] / bench["world_size"])
    except (KeyError, TypeError, ZeroDivisionError):
        per_sample = math.nan
    if isinstance(per_sample, float) and 0 < per_sample < math.inf:
        return per_sample
    raise UserError(f"--calibration {path} holds no time of the model's step without sync, which prices its compute "
                    f"(a bench JSON's no-sync row, with compute_s, batch_size and world_size, each above 0). Give "
                    f"a bench JSON of this version (python -m mpi_train bench --json PATH), or pass "
                    f"--compute-per-sample SECONDS.")


def precision_error(args: argparse.Namespace, bench: dict) -> None:
    """A --precision other than the one --calibration's bench timed its compute in is refused (its compute per
    sample would be another precision's), unless --compute-per-sample replaces it; auto takes the bench's."""
    timed = bench.get("precision", UNNAMED_PRECISION)
    if not (isinstance(timed, str) and timed in PRECISIONS) and args.compute_per_sample is None:
        raise UserError(f"--calibration {args.calibration} says it timed the model in precision {timed!r}, which is "
                        f"none of {', '.join(PRECISIONS)}: it was changed after the bench wrote it, or written by "
                        f"another version. Bench again (python -m mpi_train bench --json PATH), or pass "
                        f"--compute-per-sample SECONDS.")
    if args.precision in (PRECISION_AUTO, timed) or args.compute_per_sample is not None:
        return
    raise UserError(f"--calibration {args.calibration} timed the model's forward and backward in {timed}, and this "
                    f"prediction is for --precision {args.precision}: its compute per sample, another precision's, "
                    f"does not apply. Bench the job's precision (python -m mpi_train bench --precision "
                    f"{args.precision} --json PATH), predict for {timed} (--precision {timed}, or leave it out), or "
                    f"pass --compute-per-sample SECONDS.")


def network_for(args: argparse.Namespace, calibrated: netmodel.Network | None) -> tuple[netmodel.Network, list[str]]:
    """The links of the predicted cluster, and the assumptions that went into them."""
    notes = []
    intra = calibrated.intra if calibrated else netmodel.LOOPBACK_LINK
    described = netmodel.describe_network(netmodel.Network(intra, intra)).split(";")[0].split(": ", 1)[1]
    notes.append(f"within a host: {described}")
    if args.link:
        nominal = netmodel.nominal_link(args.link)
        alpha = calibrated.inter.alpha if calibrated and calibrated.inter.alpha > 0 else nominal.alpha
        latency = ", calibrated latency" if calibrated else ", assumed latency"
        inter = netmodel.Link(alpha, nominal.beta, source=f"--link {args.link}" + latency)
    elif calibrated:
        inter = calibrated.inter
    else:
        raise UserError("--link or --calibration is needed: say the rate of each host's link (e.g. --link 10gbit), "
                        "or give a bench JSON whose fitted links to use (--calibration bench.json).")
    notes.append(f"between hosts: alpha {inter.alpha * 1e6:.0f} us, {inter.bandwidth / 1e6:,.0f} MB/s ({inter.source})")
    measured = calibrated.collectives if calibrated else ()
    notes.extend(f"{netmodel.describe_cost(cost)}, from --calibration: every {cost.name} priced as the backend ran it "
                 f"(its bytes factor times the link's beta)" for cost in measured)
    if not any(cost.name != netmodel.ALLREDUCE for cost in measured):
        notes.append("reduce-scatter and all-gather (zero, fsdp) priced at a ring's bytes and the link's latency, as a "
                     "bandwidth-optimal backend runs them: none measured (--calibration with a bench JSON "
                     "of this version prices them as the backend ran them; Gloo over TCP runs them slower)")
    return netmodel.Network(intra, inter, collectives=measured), notes


def registered_methods(bucket_mb: float = DEFAULT_BUCKET_MB, labels: Sequence[str] | None = None,
                       period: int | None = None, host_period: int | None = None, overlap: bool = False,
                       fragments: int | None = None, precision: str = "32-true") -> dict[str, SyncMethod]:
    """Every registered method (or each of `labels`, like `localsgd+powersgd`) as a job with its default options would
    configure it (ddp_powersgd: PowerSGD at the default rank; bucketed: `bucket_mb`; localsgd and diloco: averaging
    every `period` steps, and inside each host every `host_period`; with `overlap` in the background, `fragments` at
    a time), at `precision` (resolved: fsdp gathers its parameters in it)."""
    methods = {}
    for text in labels or list(SYNC_METHODS):
        name, compression = split_label(text)
        averaging = SYNC_METHODS[name].traits.averages == PARAMETERS
        methods[text] = build_method(name, TrainConfig(
            sync=name, compression=compression, bucket_mb=bucket_mb, period=period if averaging else None,
            host_period=host_period if averaging else None, overlap=overlap and averaging,
            fragments=fragments if averaging else None, precision=precision))
    return methods


def parse_steps(text: str | None, methods: Sequence[str]) -> dict[str, int]:
    """--steps-to-accuracy `allreduce=180,localsgd=150`: steps each method needed to reach an accuracy."""
    if not text:
        return {}
    steps = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = part.partition("=")
        if name.strip() not in methods or not count.strip().isdigit() or int(count) < 1:
            raise UserError(f"--steps-to-accuracy: {part!r} must be METHOD=STEPS with a method this prediction "
                            f"covers ({', '.join(methods)}) and a positive number of steps, e.g. "
                            f"--steps-to-accuracy allreduce=180,localsgd=150 (the steps column of a report's time "
                            f"to accuracy).")
        if name.strip() in steps and steps[name.strip()] != int(count):
            raise UserError(f"--steps-to-accuracy names {name.strip()} twice, with {steps[name.strip()]} and "
                            f"{int(count)} steps: give each method once.")
        steps[name.strip()] = int(count)
    return steps


def predict_rows(tensor_bytes: list[int], ranks: int, ranks_per_host: int, network: netmodel.Network,
                 compute_s: float, methods: dict[str, SyncMethod], ratios: dict[str, tuple[float, float]],
                 backward: netmodel.Backward = netmodel.ASSUMED_BACKWARD, model=None,
                 state_slots: int = 1) -> list[Row]:
    """One row per method that declares a collective family: its step on N ranks, R per host, with this compute
    (`ratios`: each method's wire_ratio and later_share on the model's parameters); given the model, its memory
    per rank with `state_slots` optimizer state tensors per parameter (SGD's momentum buffer: 1; AdamW's
    moments: 2)."""
    layout = netmodel.Layout(ranks, min(ranks_per_host, ranks))
    units = netmodel.tensor_units(model) if model is not None else None  # fsdp's layer blocks, a message each
    rows = []
    for name, method in methods.items():
        ratio, later = ratios[name]
        prediction = netmodel.predict(method, tensor_bytes, layout, network, label=name, ratio=ratio, later=later,
                                      backward_s=backward.share * compute_s, backward=backward, compute_s=compute_s,
                                      units=units)
        if prediction is not None:
            memory = predict_memory(method, model, ranks, state_slots) if model is not None else None
            rows.append(Row(ranks=ranks, method=name, compute_s=compute_s, comm_s=prediction.comm_s,
                            exposed_s=prediction.sync_s, parts=prediction.parts, memory=memory,
                            background_s=prediction.background_s))
    return rows


@dataclass(frozen=True)
class Compute:
    """One rank's forward + backward per sample, where the figure comes from, and when backward had each gradient
    ready: what every method's predicted step is built on."""

    per_sample: float  # seconds
    precision: str  # what it was timed in, resolved (the job's, which fsdp gathers its parameters in)
    source: str
    backward: netmodel.Backward
    when: str  # how the gradients' ready times were found, for the assumptions printed


def calibration(args: argparse.Namespace, workload: TrainConfig) -> tuple[dict | None, netmodel.Network | None]:
    """--calibration's bench JSON and its fitted links (None, None without it); refused where the bench timed
    another model or precision, whose compute per sample would not apply."""
    if not args.calibration:
        return None, None
    calibrated = netmodel.load_calibration(args.calibration)
    bench = json.loads(Path(args.calibration).read_text())
    timed = bench.get("model_flags") or {"model": bench.get("model")}  # a bench JSON before the flags were kept
    differs = {name: value for name, value in timed.items() if value != model_flags(args).get(name)}
    if differs and args.compute_per_sample is None:
        raise UserError(f"--calibration {args.calibration} timed {bench.get('model_described', bench.get('model'))}"
                        f" (its {', '.join(f'{k} {v}' for k, v in differs.items())}), not this prediction's "
                        f"{workload.describe_model()}: its compute per sample does not apply. Name the model as "
                        f"the bench did, or pass --compute-per-sample SECONDS.")
    precision_error(args, bench)
    return bench, calibrated


def compute_of(args: argparse.Namespace, workload: TrainConfig, bench: dict | None, tensors: int) -> Compute:
    """The compute per sample from --compute-per-sample, else the bench's no-sync baseline, else the model timed
    here; the gradients' ready times from the bench's backward where it has one, else from the model timed here."""
    backward = netmodel.ASSUMED_BACKWARD
    benched = bench.get("precision", UNNAMED_PRECISION) if bench is not None else None
    if args.precision != PRECISION_AUTO:
        precision = args.precision
    elif benched is not None:
        precision = benched
    else:
        import torch  # here, not at the top: as measured_compute

        precision = resolve(args.precision, torch.device("cpu")).name
    if args.compute_per_sample is not None:
        per_sample, source = args.compute_per_sample, "--compute-per-sample" + (
            f", {args.precision}" if args.precision != PRECISION_AUTO else "")
    elif bench is not None:
        per_sample = compute_from_bench(bench, args.calibration)
        source = f"in {benched}, the no-sync baseline of {args.calibration}"
    else:
        per_sample, backward = measured_compute(workload, precision=precision)
        source = f"in {precision}, timed here (batch 16, one process, this machine's CPU)"
    if bench is not None:
        backward = netmodel.load_backward(args.calibration, tensors)
    when = ("gradients ready as the calibration's no-sync backward had them" if bench is not None and backward.ready
            else "gradients ready as the model's backward had them here" if backward.ready is not None
            else "gradients produced at a constant rate, last layer first")
    return Compute(per_sample=per_sample, precision=precision, source=source, backward=backward, when=when)


def per_rank_batch(args: argparse.Namespace, ranks: int) -> float:
    return args.per_rank_batch if args.per_rank_batch else args.batch_size / ranks


def batch_words(args: argparse.Namespace) -> str:
    """`global batch 256 split across the ranks`, or the weak scaling's batch per rank."""
    return (f"{args.per_rank_batch:g} per rank (weak scaling)" if args.per_rank_batch
            else f"global batch {args.batch_size} split across the ranks")


def print_assumptions(args: argparse.Namespace, workload: TrainConfig, tensor_bytes: list[int], compute: Compute,
                      notes: list[str]) -> None:
    """The model, the batch and every assumption the figures below rest on, before the figures."""
    print(f"{workload.describe_model()}: {len(tensor_bytes)} gradient tensors, {sum(tensor_bytes) / 1e6:.1f} MB; "
          f"{batch_words(args)}; {args.ranks_per_host} ranks per host")
    print("assumptions:")
    computed = f"compute {compute.per_sample * 1e3:.2f} ms per sample ({compute.source}), scaled to each rank's batch"
    for note in [computed, *notes,
                 "ranks numbered host by host (as mpirun fills a hostfile); optimizer and data time left out",
                 (f"ddp and bucketed send {args.bucket_mb:g} MB buckets during backward (backward = "
                  f"{compute.backward.share:.2f} of compute, {compute.when}); only what outlasts backward is exposed")]:
        print(f"  - {note}")


def print_single(args: argparse.Namespace, ranks: int, rows: list[Row], methods: dict[str, SyncMethod], state: str,
                 steps_to_accuracy: dict[str, int]) -> None:
    """One cluster: each method's step, the winner, then memory per rank and, if given, time to accuracy."""
    hosts = netmodel.Layout(ranks, min(args.ranks_per_host, ranks)).hosts
    print(f"\n{ranks} ranks on {hosts} host(s), per-rank batch {per_rank_batch(args, ranks):g}:")
    print(format_single(rows))
    best = min(rows, key=lambda r: r.step_s)
    for line in overlap_verdicts(rows, methods):
        print(line)
    print(f"\nwinner: {best.method} ({best.step_s * 1e3:.1f} ms per step, "
          f"scaling efficiency {best.efficiency:.2f})")
    for line in cuda_only_overlaps(rows, methods):
        print(line)
    print(f"\nmemory per rank ({state}; params +U: one unit gathered at a time, ZeRO-3) and "
          f"communication by collective, least memory first:")
    print(format_memory(rows))
    if steps_to_accuracy:
        print("\n" + format_time_to_accuracy(rows, steps_to_accuracy))


def print_scaling(args: argparse.Namespace, workload: TrainConfig, table: dict[int, list[Row]], state: str) -> None:
    """Several cluster sizes: the step and memory tables, and the plot."""
    print()
    print(format_scaling(table))
    print(f"\nmemory per rank, MiB ({state}):")
    print(format_memory_scaling(table))
    link = args.link or "calibrated link"
    title = f"{workload.model_name}, {batch_words(args)}, {args.ranks_per_host} ranks/host, {link}: predicted"
    failure = kept(f"the plot {args.plot}", lambda: plot_scaling(table, title, Path(args.plot)))
    if failure:
        raise UserError(f"the tables above hold the prediction, but {failure}. Free space there, or name another "
                        f"place with --plot.")
    print(f"plot: {args.plot}")


def run(args: argparse.Namespace) -> None:
    """Each method predicted on each cluster size asked: one table with the winner, or the scaling tables and plot."""
    # the flags and the calibration refused where they cannot apply, before the model is built
    ranks = parse_ranks(args.ranks)
    check_numbers(args)
    check_batch_splits(args, ranks)
    if len(ranks) > 1 and (problem := unwritable([("--plot", args.plot, False)])):
        raise UserError(f"{problem} Nothing was predicted.")
    if len(ranks) > 1 and Path(args.plot).suffix.lower() != ".png":
        raise UserError(f"--plot {args.plot}: the plot is drawn as a PNG image, and this name says otherwise. Name a "
                        f"file ending in .png. Nothing was predicted.")
    workload = model_config(args, optimizer=args.optimizer, momentum=args.momentum)
    workload.validate_optimizer()  # --momentum with adamw: refused
    bench, calibrated = calibration(args, workload)
    network, notes = network_for(args, calibrated)
    check_averaging(args)
    # the model's own tensors, its compute per sample, and the methods configured as a job would configure them
    model = meta_model(workload)
    params = [p for p in model.parameters() if p.requires_grad]
    tensor_bytes = [p.numel() * p.element_size() for p in params]
    compute = compute_of(args, workload, bench, len(tensor_bytes))
    labels = parse_labels(args.methods) if args.methods else None
    methods = registered_methods(args.bucket_mb, labels, args.period, args.host_period, args.overlap, args.fragments,
                                 compute.precision)
    steps_to_accuracy = parse_steps(args.steps_to_accuracy, list(methods))
    shaping = [flag for flag, given in (("--overlap", args.overlap), ("--period", args.period is not None),
                                        ("--host-period", args.host_period is not None),
                                        ("--fragments", args.fragments is not None)) if given]
    if shaping and not any(method.traits.averages == PARAMETERS for method in methods.values()):
        raise UserError(f"{', '.join(shaping)} shape how localsgd and diloco average the models, and --methods "
                        f"{args.methods} names neither, so the prediction would ignore them. Add localsgd or diloco "
                        f"to --methods, or drop {shaping[0]}.")
    ratios = {name: (netmodel.wire_ratio(method, params), netmodel.later_share(method, params))
              for name, method in methods.items()}
    # each method's step and memory on each cluster size
    print_assumptions(args, workload, tensor_bytes, compute, notes)
    settings = workload.optimizer_settings  # --optimizer and --momentum, else the model's
    state = describe_state(settings.optimizer, settings.momentum)
    table = {n: predict_rows(tensor_bytes, n, args.ranks_per_host, network,
                             compute.per_sample * per_rank_batch(args, n), methods, ratios, compute.backward, model,
                             state_slots(settings)) for n in ranks}
    if len(ranks) == 1:
        print_single(args, ranks[0], table[ranks[0]], methods, state, steps_to_accuracy)
        if args.plot != DEFAULT_PLOT:
            print(f"plot: none written to {args.plot}: the plot draws the prediction against several cluster sizes, "
                  f"and --ranks names one (e.g. --ranks 2,4,8,16)")
    else:
        print_scaling(args, workload, table, state)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except UserError as error:
        print(format_error(str(error), prog="mpi_train predict"), file=sys.stderr)
        return error.exit_code
    return 0
