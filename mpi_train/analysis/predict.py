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
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import netmodel
from ..clock import Clock
from ..commands.bench import BackwardClock
from ..config import TrainConfig, add_config_arguments, add_model_arguments, model_config, model_flags
from ..data import synthetic_batch
from ..errors import UserError, format_error
from ..netmodel.memory import MemoryPrediction, predict_memory
from ..optimizers import describe_state, state_slots
from ..step.precision import PRECISION_AUTO, PRECISIONS, UNNAMED_PRECISION, resolve
from ..sync import PARAMETERS, SYNC_METHODS, SyncMethod, parse_labels, split_label
from ..sync.averaging import DEFAULT_PERIOD


@dataclass(frozen=True)
class Row:
    ranks: int
    method: str
    compute_s: float
    comm_s: float
    exposed_s: float
    parts: dict = field(default_factory=dict)  # seconds per step of each collective (netmodel Prediction.parts)
    memory: MemoryPrediction | None = None  # bytes per rank
    background_s: float | None = None  # per step, averages sent in the background (--overlap)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_s

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s if self.step_s else 1.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mpi_train predict", description=__doc__.split("\n")[0],
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
    parser.add_argument("--plot", default="predict_scaling.png",
                        help="with several --ranks: where the plot goes (default: predict_scaling.png)")
    return parser


def parse_ranks(text: str) -> list[int]:
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ranks = []
    if not ranks or any(r < 1 for r in ranks):
        raise UserError(f"--ranks {text!r} must be a positive number of ranks or a comma-separated list of them, "
                        f"e.g. --ranks 64 or --ranks 2,4,8,16.")
    return sorted(set(ranks))


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


def compute_from_bench(bench: dict) -> float:
    """Seconds per sample of the bench's no-sync baseline (forward + backward on one rank's share of its batch)."""
    baseline = next(row for row in bench["methods"] if row["method"] == "no-sync")
    return baseline["compute_s"] / (bench["batch_size"] / bench["world_size"])


def precision_error(args: argparse.Namespace, bench: dict) -> None:
    """A --precision other than the one --calibration's bench timed its compute in is refused (its compute per
    sample would be another precision's), unless --compute-per-sample replaces it; auto takes the bench's."""
    timed = bench.get("precision", UNNAMED_PRECISION)
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


def registered_methods(bucket_mb: float = TrainConfig.bucket_mb, labels: Sequence[str] | None = None,
                       period: int | None = None, host_period: int | None = None, overlap: bool = False,
                       fragments: int | None = None) -> dict[str, SyncMethod]:
    """Every registered method (or each of `labels`, like `localsgd+powersgd`) as a job with its default options would
    configure it (ddp_powersgd: PowerSGD at the default rank; bucketed: `bucket_mb`; localsgd and diloco: averaging
    every `period` steps, and inside each host every `host_period`; with `overlap` in the background, `fragments` at
    a time)."""
    methods = {}
    for text in labels or list(SYNC_METHODS):
        name, compression = split_label(text)
        averaging = SYNC_METHODS[name].averages == PARAMETERS
        methods[text] = SYNC_METHODS[name].from_config(TrainConfig(
            sync=name, compression=compression, bucket_mb=bucket_mb, period=period if averaging else None,
            host_period=host_period if averaging else None, overlap=overlap and averaging,
            fragments=fragments if averaging else None))
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
            rows.append(Row(ranks, name, compute_s, prediction.comm_s, prediction.sync_s, prediction.parts, memory,
                            prediction.background_s))
    return rows


def format_single(rows: list[Row]) -> str:
    lines = [f"{'method':<20}{'compute_ms':>12}{'comm_ms':>12}{'exposed_ms':>12}{'step_ms':>12}{'efficiency':>12}"]
    for row in sorted(rows, key=lambda r: r.step_s):
        lines.append(f"{row.method:<20}{row.compute_s * 1e3:>12.1f}{row.comm_s * 1e3:>12.1f}"
                     f"{row.exposed_s * 1e3:>12.1f}{row.step_s * 1e3:>12.1f}{row.efficiency:>12.2f}")
    return "\n".join(lines)


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f}"


def format_memory(rows: list[Row]) -> str:
    """Memory per rank and communication by collective, least memory first: what a method buys and what it pays."""
    lines = [(f"{'method':<20}{'params_MiB':>12}{'grads_MiB':>11}{'optim_MiB':>11}{'total_MiB':>11}  "
             f"communication per step by collective")]
    for row in sorted((r for r in rows if r.memory is not None), key=lambda r: (r.memory.total, r.step_s)):
        held = row.memory
        params = mib(held.parameters) + (f"+{mib(held.gathered)}" if held.gathered else "")
        collectives = " + ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in row.parts.items())
        lines.append(f"{row.method:<20}{params:>12}{mib(held.gradients):>11}{mib(held.optimizer):>11}"
                     f"{mib(held.total):>11}  {collectives}")
    return "\n".join(lines)


def overlap_verdicts(rows: list[Row], methods: dict[str, SyncMethod]) -> list[str]:
    """For each method whose averages travel in the background: free (its transfer fits in the local steps until
    the next average) or what it costs per average when it does not."""
    lines = []
    for row in rows:
        if row.background_s is None:
            continue
        every = netmodel.averaging_every(methods[row.method])
        transfer, window = row.background_s * every, row.compute_s * every
        exposed = netmodel.overlapped_exposed(transfer, window)
        verdict = "free: it fits" if exposed <= 0 else f"exposed {exposed:.2f} s per average = transfer - compute"
        lines.append(f"{row.method} --overlap: an average every {every} steps takes {transfer:.2f} s against "
                     f"{window:.2f} s of their compute: {verdict}")
    return lines


def cuda_only_overlaps(rows: list[Row], methods: dict[str, SyncMethod]) -> list[str]:
    """For each method that overlaps its communication only on CUDA: exposed is the CUDA case; on CPU, comm."""
    return [f"{row.method}: exposed assumes CUDA; on CPU the step pays its comm, {row.comm_s * 1e3:.1f} ms "
            f"({methods[row.method].overlaps_only_on_cuda})"
            for row in rows if methods[row.method].overlaps_only_on_cuda]


def format_time_to_accuracy(rows: list[Row], steps: dict[str, int]) -> str:
    """Steps to accuracy (the method's, measured on any network) times the predicted step here, fastest first."""
    known = sorted(((row, steps[row.method]) for row in rows if row.method in steps),
                   key=lambda pair: pair[0].step_s * pair[1])
    lines = ["time to accuracy here = steps to accuracy (as given) x predicted step:",
             f"{'method':<20}{'steps':>8}{'step_ms':>12}{'time_s':>12}"]
    for row, count in known:
        lines.append(f"{row.method:<20}{count:>8}{row.step_s * 1e3:>12.1f}{row.step_s * count:>12.1f}")
    return "\n".join(lines)


def format_scaling(table: dict[int, list[Row]]) -> str:
    methods = [row.method for row in next(iter(table.values()))]
    width = max(12, max(len(m) for m in methods) + 2)
    lines = [f"{'ranks':>6}" + "".join(f"{m:>{width}}" for m in methods) + f"{'winner':>{width}}",
             "step time, ms (scaling efficiency)"]
    for ranks, rows in table.items():
        cells = "".join(f"{f'{r.step_s * 1e3:.0f} ({r.efficiency:.2f})':>{width}}" for r in rows)
        lines.append(f"{ranks:>6}{cells}{min(rows, key=lambda r: r.step_s).method:>{width}}")
    return "\n".join(lines)


def format_memory_scaling(table: dict[int, list[Row]]) -> str:
    methods = [row.method for row in next(iter(table.values()))]
    width = max(12, max(len(m) for m in methods) + 2)
    lines = [f"{'ranks':>6}" + "".join(f"{m:>{width}}" for m in methods)]
    for ranks, rows in table.items():
        lines.append(f"{ranks:>6}" + "".join(f"{mib(r.memory.total) if r.memory else '-':>{width}}" for r in rows))
    return "\n".join(lines)


def plot_scaling(table: dict[int, list[Row]], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = list(table)
    methods = [row.method for row in table[ranks[0]]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 9), sharex=True)
    for index, method in enumerate(methods):  # methods that predict alike (flat and ring) differ in line and marker
        style = {"linestyle": ("-", "--", "-.", ":")[index % 4], "marker": "os^Dv<>PX"[index % 9], "markersize": 5}
        steps = [next(r for r in table[n] if r.method == method) for n in ranks]
        top.plot(ranks, [1000 * r.step_s for r in steps], label=method, **style)
        bottom.plot(ranks, [r.efficiency for r in steps], label=method, **style)
    top.plot(ranks, [1000 * table[n][0].compute_s for n in ranks], color="black", linewidth=1, linestyle=":",
             label="compute alone (ideal)")
    top.set(xscale="log", yscale="log", ylabel="predicted step time (ms)", title=title)
    bottom.set(xscale="log", ylim=(0, 1.05), xlabel="ranks", ylabel="scaling efficiency (compute / step)")
    bottom.set_xticks(ranks, [str(n) for n in ranks])
    for axis in (top, bottom):
        axis.grid(alpha=0.3, which="both")
    top.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> None:
    ranks = parse_ranks(args.ranks)
    if args.momentum is not None and not 0 <= args.momentum < 1:
        raise UserError(f"--momentum must be in [0, 1), got {args.momentum}.")
    for flag, value in {"--batch-size": args.batch_size, "--ranks-per-host": args.ranks_per_host,
                        "--bucket-mb": args.bucket_mb, "--per-rank-batch": args.per_rank_batch,
                        "--compute-per-sample": args.compute_per_sample}.items():
        if value is not None and value <= 0:
            raise UserError(f"{flag} must be positive, got {value}.")
    if args.link:
        try:
            netmodel.rate_bytes_per_s(args.link)
        except ValueError as error:
            raise UserError(f"--link: {error}.") from None
    workload = model_config(args, optimizer=args.optimizer, momentum=args.momentum)
    workload.validate_optimizer()  # --momentum with adamw: refused
    bench, calibrated = None, None
    if args.calibration:
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
    network, notes = network_for(args, calibrated)
    if args.period is not None and args.period < 1 or args.host_period is not None and args.host_period < 0:
        raise UserError(f"--period must be at least 1 and --host-period not negative, got {args.period} and "
                        f"{args.host_period}.")
    period = args.period if args.period is not None else DEFAULT_PERIOD
    if args.fragments is not None and (args.fragments < 1 or period % args.fragments):
        raise UserError(f"--fragments {args.fragments} must be at least 1 and divide --period {period}: one fragment "
                        f"is averaged every period/F steps.")
    model = meta_model(workload)
    params = [p for p in model.parameters() if p.requires_grad]
    tensor_bytes = [p.numel() * p.element_size() for p in params]
    backward = netmodel.ASSUMED_BACKWARD
    if args.compute_per_sample is not None:
        per_sample, source = args.compute_per_sample, "--compute-per-sample" + (
            f", {args.precision}" if args.precision != PRECISION_AUTO else "")
    elif bench is not None:
        per_sample = compute_from_bench(bench)
        source = f"in {bench.get('precision', UNNAMED_PRECISION)}, the no-sync baseline of {args.calibration}"
    else:
        import torch  # here, not at the top: as measured_compute

        precision = resolve(args.precision, torch.device("cpu")).name
        per_sample, backward = measured_compute(workload, precision=precision)
        source = f"in {precision}, timed here (batch 16, one process, this machine's CPU)"
    if bench is not None:
        backward = netmodel.load_backward(args.calibration, len(tensor_bytes))
    labels = parse_labels(args.methods) if args.methods else None
    methods = registered_methods(args.bucket_mb, labels, args.period, args.host_period, args.overlap, args.fragments)
    steps_to_accuracy = parse_steps(args.steps_to_accuracy, list(methods))
    ratios = {name: (method.wire_ratio(params), method.later_share(params)) for name, method in methods.items()}
    when = ("gradients ready as the calibration's no-sync backward had them" if bench is not None and backward.ready
            else "gradients ready as the model's backward had them here" if backward.ready is not None
            else "gradients produced at a constant rate, last layer first")

    def per_rank(n: int) -> float:
        return args.per_rank_batch if args.per_rank_batch else args.batch_size / n

    batch = (f"{args.per_rank_batch:g} per rank (weak scaling)" if args.per_rank_batch
             else f"global batch {args.batch_size} split across the ranks")
    print(f"{workload.describe_model()}: {len(tensor_bytes)} gradient tensors, {sum(tensor_bytes) / 1e6:.1f} MB; "
          f"{batch}; {args.ranks_per_host} ranks per host")
    print("assumptions:")
    for note in [f"compute {per_sample * 1e3:.2f} ms per sample ({source}), scaled to each rank's batch",
                 *notes, "ranks numbered host by host (as mpirun fills a hostfile); optimizer and data time left out",
                 (f"ddp and bucketed send {args.bucket_mb:g} MB buckets during backward (backward = "
                  f"{backward.share:.2f} of compute, {when}); only what outlasts backward is exposed")]:
        print(f"  - {note}")
    settings = workload.optimizer_settings  # --optimizer and --momentum, else the model's
    state = describe_state(settings.optimizer, settings.momentum)
    table = {n: predict_rows(tensor_bytes, n, args.ranks_per_host, network, per_sample * per_rank(n), methods, ratios,
                             backward, model, state_slots(settings)) for n in ranks}
    if len(ranks) == 1:
        rows = table[ranks[0]]
        hosts = netmodel.Layout(ranks[0], min(args.ranks_per_host, ranks[0])).hosts
        print(f"\n{ranks[0]} ranks on {hosts} host(s), per-rank batch {per_rank(ranks[0]):g}:")
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
        return
    print()
    print(format_scaling(table))
    print(f"\nmemory per rank, MiB ({state}):")
    print(format_memory_scaling(table))
    link = args.link or "calibrated link"
    path = plot_scaling(table, f"{workload.model_name}, {batch}, {args.ranks_per_host} ranks/host, {link}: predicted",
                        Path(args.plot))
    print(f"plot: {path}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except UserError as error:
        print(format_error(str(error), prog="mpi_train predict"), file=sys.stderr)
        return error.exit_code
    return 0
