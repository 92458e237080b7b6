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
from collections.abc import Sequence

import torch.distributed as dist

from .. import tracking
from ..benchmark.bench_report import describe
from ..benchmark.bench_result import bench_result
from ..benchmark.calibration import bench_links
from ..benchmark.contenders import contenders, gradient_bytes, traffic
from ..benchmark.flags import add_job_arguments, check_job_arguments
from ..benchmark.job import open_job, rank_zero_print, unkept
from ..benchmark.measure import measure
from ..benchmark.mlflow_runs import log_bench
from ..cluster import Cluster
from ..config import add_config_arguments, add_model_arguments, model_config
from ..data import synthetic_batch
from ..errors import UserError
from ..files import kept, without_nan, write_json_atomically
from ..rankguard import RankAwareParser, guarded, join_job
from ..sync import parse_labels
from ..sync.bucketed import DEFAULT_BUCKET_MB
from ..sync.compression.powersgd import DEFAULT_RANK
from ..tracking.links import where


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    parser = RankAwareParser(prog="python -m mpi_train bench", quiet=quiet, description=__doc__.split("\n")[0])
    add_model_arguments(parser)
    add_job_arguments(parser, ("batch_size",), {
        "batch_size": "global batch of synthetic samples shaped for the model (images, or sequences of gpt's "
                      "context), split across ranks (default: 256)"})
    add_config_arguments(parser, ("precision",))  # the job's: forward and backward are timed as it computes them
    parser.add_argument("--steps", type=int, default=20, help="timed steps per method (default: 20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per method first (default: 2)")
    parser.add_argument("--json", metavar="PATH", help="rank 0 writes every figure here")
    add_job_arguments(parser, ("launcher", "backend", "threads", "bucket_mb"), {
        "bucket_mb": f"bucket size for the bucketed method (default: {DEFAULT_BUCKET_MB:g})"},
        defaults={"bucket_mb": DEFAULT_BUCKET_MB})
    parser.add_argument("--methods", help="comma-separated methods to measure, as labelled in the table, e.g. "
                        "ddp,bucketed,bucketed+powersgd (default: every method with every compression it carries)")
    add_job_arguments(parser, ("powersgd_rank",), {
        "powersgd_rank": f"rank of PowerSGD's factors (default: {DEFAULT_RANK}); it compresses from the first "
                         f"step here"}, defaults={"powersgd_rank": DEFAULT_RANK})
    parser.add_argument("--link-iters", type=int, default=3,
                        help="timed repetitions per message size of the link calibration (default: 3)")
    add_job_arguments(parser, ("link", "master_addr", "timeout", "tracking_uri", "experiment", "run_name",
                               "no_tracking"), {
        "link": "the link rate the hosts were shaped to (e.g. 1gbit): recorded, and the calibrated inter-host "
                "bandwidth is capped at it",
        "experiment": "MLflow experiment the benchmark run is filed under (default: mpi_train)",
        "run_name": "name of the benchmark run (default: bench-MODEL-npN)",
        "no_tracking": "do not record the benchmark in MLflow"})
    return parser


def validate(args: argparse.Namespace, world: int) -> None:
    for flag, value in {"--batch-size": args.batch_size, "--steps": args.steps, "--link-iters": args.link_iters,
                        "--bucket-mb": args.bucket_mb, "--powersgd-rank": args.powersgd_rank}.items():
        if not value > 0:
            raise UserError(f"{flag} must be positive, got {value}.")
    if args.warmup < 0:
        raise UserError(f"--warmup must not be negative, got {args.warmup}.")
    parse_labels(args.methods)
    check_job_arguments(args, world)


def run(cluster: Cluster, args: argparse.Namespace) -> int:
    info, world, say = cluster.info, cluster.info.world_size, rank_zero_print(cluster)
    validate(args, world)
    settings = model_config(args, batch_size=args.batch_size, tracking_uri=tracking.resolve_uri(args.tracking_uri),
                            experiment=args.experiment, no_tracking=args.no_tracking)
    job = open_job(cluster, args, settings, [("--json", args.json, False)])
    device, backend = job.placement.device, job.placement.backend

    # Set up: a replica per method, what each sends, then the links they cross
    entries, unavailable = contenders(settings, device, args.bucket_mb, parse_labels(args.methods), backend,
                                      args.powersgd_rank, job.precision)
    if args.methods and len(entries) == 1:  # the baseline alone: every method named is refused here
        raise UserError(f"--methods {args.methods} leaves the bench nothing to measure, as the {backend} backend "
                        f"runs none of them. " + " ".join(why for _, why in unavailable))
    sent_and_later = traffic(entries)
    largest = gradient_bytes(entries[0].model)
    if world > 1:
        say(f"bench: calibrating the links (ping-pong; allreduce, reduce-scatter and all-gather, 1 KB .. "
            f"{largest / 1e6:.1f} MB)")
    calibration, link = bench_links(cluster, largest, args.link_iters, device, args.link, backend)

    # Measure: every method round robin, a different one first each step; every rank's times go to rank 0
    images, labels = (part.to(device) for part in synthetic_batch(settings, args.batch_size // world))
    for entry in entries:
        entry.model.train()

    def progress(step: int, total: int, warming: bool) -> None:
        say(f"bench step {step:>4}/{total}{'  (warm-up)' if warming else ''}")

    say(f"bench: {world} rank(s), {job.placement.threads} thread(s) each, {job.precision}, methods "
        f"{', '.join(e.name for e in entries)}")
    times, order = measure(entries, images, labels, args.steps, args.warmup, device, progress, job.precision)
    per_rank = cluster.gather(times)
    dist.destroy_process_group()
    if info.is_main:
        result = bench_result(args, cluster=cluster, placement=job.placement, precision=job.precision,
                              settings=settings, entries=entries, unavailable=unavailable, calibration=calibration,
                              link=link, traffic=sent_and_later, per_rank=per_rank, order=order)
        return report(args, result, job.connection)
    return 0


def report(args: argparse.Namespace, result: dict, connection: tracking.Connection | None) -> int:
    """Rank 0: the table on stdout, the JSON to --json, the runs to MLflow; the exit status (2: a file not kept)."""
    text = describe(result)
    print(text, flush=True)
    unwritten = args.json and kept(f"--json {args.json}", lambda: write_json_atomically(args.json, without_nan(result)))
    if args.json and not unwritten:
        print(f"wrote {args.json}")
    if connection is not None:
        run_id = log_bench(connection, args.run_name or f"bench-{args.model}-np{result['world_size']}", result, text)
        print(f"logged as MLflow run {run_id} in experiment {args.experiment!r}, a child run per method; "
              + where(connection.uri, connection.experiment_id, run_id, charts=True), flush=True)
    return unkept([unwritten], "The bench measured its methods")


def main(argv: Sequence[str] | None = None) -> int:
    cluster = join_job(argv)
    args = build_parser(quiet=not cluster.info.is_main).parse_args(argv)
    return guarded(cluster, lambda: run(cluster, args))
