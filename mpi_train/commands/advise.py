"""`python -m mpi_train advise`: which sync method to run on these hosts, predicted, measured, and kept for --sync auto.

    mpirun -np 4 --hostfile hostfile python -m mpi_train advise --model vgg11 --batch-size 256
    mpirun -np 4 --hostfile hostfile python -m mpi_train --model vgg11 --batch-size 256 --sync auto

Started like the training job it advises, on the same hosts and ranks, it:

1. calibrates the links as the bench does (ping-pong within a host and between hosts, fitted to
   alpha + beta·m), or takes the calibration of the newest advice on the same hosts at the same
   --link, saying how old it is (--fresh measures again);
2. times the model's forward and backward without sync under the job's --precision, and when
   backward has each gradient ready (the bench's BackwardClock, the median over every rank's
   steps);
3. predicts every lossless method's step, bucketed at every bucket size that cuts the gradients
   differently (mpi_train/advice/search.py);
4. measures the --measure methods predicted fastest (each at its best bucket size), ddp as the
   reference and, beside a searched bucket size, the 25 MB default, in a short bench: round
   robin between barriers with a no-sync baseline, as `python -m mpi_train bench` does;
5. recommends the configuration measured fastest: the flags to add to `python -m mpi_train`, its
   predicted and measured step, and why (the step without sync, the exposed communication, the
   link that binds).

Lossy options (fp16, bf16, PowerSGD, and methods that average models every few steps) are listed
apart, each with its predicted step and the accuracy cost the project measured (ACCURACY_COST),
and are never recommended. The advice is kept under mlruns/advice/ (--advice-dir) for `--sync
auto`, written to --json too, and logged to MLflow (tag mpi_train.role = advice, a child run per
candidate shown) unless --no-tracking. An advice holds for the --precision it was given (a job
under another computes faster or slower, and --sync auto looks for one made for its own).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from functools import partial

import torch
import torch.distributed as dist

from .. import netmodel, tracking
from ..advice import cache, memory_limit, search
from ..benchmark import advice_plot, advice_report, calibration, shortlist
from ..benchmark.advice_result import advice_result
from ..benchmark.flags import add_job_arguments, check_job_arguments
from ..benchmark.job import open_job, rank_zero_print, unkept
from ..benchmark.mlflow_runs import log_advice
from ..benchmark.short_bench import PROFILE_STEPS, ShortBench, say_progress
from ..cluster import Cluster
from ..config import ADVICE_DIR, add_config_arguments, add_model_arguments, model_config, model_flag_words
from ..data import synthetic_batch
from ..errors import UserError
from ..files import kept, write_json_atomically
from ..rankguard import RankAwareParser, guarded, join_job
from ..step.precision import PRECISION_AUTO
from ..tracking.links import where


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    parser = RankAwareParser(prog="python -m mpi_train advise", quiet=quiet, description=__doc__.split("\n")[0])
    add_model_arguments(parser)  # the job's model (a job's --dataset synthetic or mnist trains mnist_cnn by default)
    add_job_arguments(parser, ("batch_size",), {
        "batch_size": "the job's global batch, split across ranks (default: 256)"})
    parser.add_argument("--json", metavar="PATH", help="rank 0 also writes the advice here")
    parser.add_argument("--advice-dir", default=ADVICE_DIR,
                        help=f"where advice is kept, for --sync auto and for reusing a calibration (default: "
                             f"{ADVICE_DIR})")
    parser.add_argument("--fresh", action="store_true",
                        help="calibrate the links again even if an advice on these hosts holds a calibration")
    parser.add_argument("--measure", type=int, default=3, metavar="N",
                        help="methods predicted fastest to measure, each at its best bucket size, beside ddp "
                             "(default: 3)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps of the short bench (default: 2)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed steps first (default: 1: bucketed learns its order, ddp builds its buckets)")
    parser.add_argument("--full-bench", type=int, default=0, metavar="STEPS",
                        help="after advising, also measure every lossless method, bucketed at "
                             f"{', '.join(f'{mb:g}' for mb in search.FULL_BENCH_MB)} MB and at the measured "
                             "sizes, STEPS timed steps each, and print the recommendation's regret against the "
                             "fastest of them and Kendall's tau of predicted against measured (the advisor's own "
                             "check; default: 0, off)")
    parser.add_argument("--memory-limit", metavar="SIZE",
                        help="bytes a rank may hold for parameters, gradients and optimizer state, e.g. 2GiB or "
                             "512MiB (B, KiB, MiB, GiB): configurations the model predicts above it are left out, "
                             "with why (default: no limit)")
    # the job's: the optimizer's state is part of the memory per rank, the precision times its compute
    add_config_arguments(parser, ("optimizer", "precision"))
    parser.add_argument("--link-iters", type=int, default=2,
                        help="timed repetitions per message size of the link calibration (default: 2)")
    add_job_arguments(parser, ("link", "launcher", "backend", "threads", "master_addr", "timeout", "tracking_uri",
                               "experiment", "run_name", "no_tracking"), {
        "link": "the link rate the hosts were shaped to (e.g. 100mbit): recorded, and the calibrated bandwidth "
                "between hosts is capped at it",
        "experiment": "MLflow experiment the advice run is filed under (default: mpi_train)",
        "run_name": "name of the advice run (default: advice-MODEL-npN)",
        "no_tracking": "do not record the advice in MLflow"})
    return parser


def validate(args: argparse.Namespace, world: int) -> None:
    memory_limit.parse_size(args.memory_limit)
    if world < 2:
        raise UserError("the advisor compares ways of syncing ranks, and this job has one rank. Start it like the "
                        "training job, e.g. mpirun -np 4 --hostfile hostfile python -m mpi_train advise.")
    for flag, value in {"--batch-size": args.batch_size, "--steps": args.steps, "--measure": args.measure,
                        "--link-iters": args.link_iters}.items():
        if not value > 0:
            raise UserError(f"{flag} must be positive, got {value}.")
    if args.warmup < 0:
        raise UserError(f"--warmup must not be negative, got {args.warmup}.")
    if args.full_bench < 0:
        raise UserError(f"--full-bench takes the timed steps of the full bench, got {args.full_bench}; 0 skips it.")
    check_job_arguments(args, world)


def run(cluster: Cluster, args: argparse.Namespace) -> int:
    info, world, say = cluster.info, cluster.info.world_size, rank_zero_print(cluster)
    validate(args, world)
    workload = model_config(args, batch_size=args.batch_size, tracking_uri=tracking.resolve_uri(args.tracking_uri),
                            experiment=args.experiment, no_tracking=args.no_tracking, optimizer=args.optimizer)
    job = open_job(cluster, args, workload, [("--advice-dir", args.advice_dir, True), ("--json", args.json, False)])
    device, backend, progress = job.placement.device, job.placement.backend, partial(say_progress, info.is_main)
    started = time.perf_counter()

    # Calibrate: the links, reused from an advice on these hosts unless --fresh
    torch.manual_seed(0)
    template = workload.make_model().to(device).train()
    if args.memory_limit:  # a limit that no method fits is refused now, before the links and the model are timed
        shortlist.searched(backend, template, None, world, workload.optimizer_settings, args.memory_limit)
    setting = cache.Setting(tuple(cluster.hosts), args.model, args.batch_size, args.precision)
    say(f"advise: {setting.describe()}, backend {backend}, {job.placement.threads} thread(s) per rank")
    links = calibration.advice_links(cluster, advice_dir=args.advice_dir, fresh=args.fresh, link_rate=args.link,
                                     largest=int(sum(netmodel.tensor_sizes(template))), iters=args.link_iters,
                                     device=device)
    images, labels = (part.to(device) for part in synthetic_batch(workload, args.batch_size // world))
    bench = ShortBench(template=template, images=images, labels=labels, warmup=args.warmup, device=device,
                       precision=job.precision)

    # Profile the model without sync, then shortlist the configurations predicted fastest
    say(f"advise: timing {workload.describe_model()}'s forward and backward without sync ({PROFILE_STEPS} steps)")
    times, order = bench.profile(progress("no-sync"))
    profile = cluster.gather(times)
    found = shortlist.searched(backend, template, order, world, workload.optimizer_settings, args.memory_limit)
    profiled = (shortlist.profiled_model(profile, order, links, template, cluster.hosts, job.precision)
                if info.is_main else None)
    chosen = shortlist.shortlist(cluster, found, profiled, args.measure)
    say(f"advise: predicted {len(found.found)} lossless configurations; measuring "
        f"{', '.join(c.label for c in chosen)} ({args.steps} timed step(s) after {args.warmup} warm-up)")

    # Measure the shortlist, and with --full-bench every configuration
    per_rank = cluster.gather(bench.time(chosen, args.steps, progress("bench")))
    advised_s = time.perf_counter() - started  # what the advice itself took, a full bench left out
    full = None
    if args.full_bench:
        grid = search.full_grid(found.found, chosen)
        say(f"advise: full bench of {len(grid)} lossless configurations ({args.full_bench} timed step(s) after "
            f"{args.warmup} warm-up each)")
        merged = bench.full(grid, args.full_bench, progress)
        full = (grid, cluster.gather(merged), time.perf_counter() - started - advised_s)
    dist.destroy_process_group()
    if info.is_main:
        result = advice_result(args, cluster=cluster, placement=job.placement, precision=job.precision,
                               settings=workload, template=template, links=links, searched=found, profiled=profiled,
                               chosen=chosen, per_rank=per_rank, advised_s=advised_s, full=full)
        return report(args, result, setting, job.connection)
    return 0


def report(args: argparse.Namespace, result: dict, setting: cache.Setting, connection) -> int:
    """Rank 0: the advice on stdout, kept for --sync auto (with its plot), written to --json, logged to MLflow; the
    exit status (2: a file not kept)."""
    text = advice_report.describe(result)
    print(text, flush=True)
    path = setting.path(args.advice_dir, result["created_s"])
    picture = path.with_suffix(".png")
    failures = [kept(f"the advice {path}", lambda: cache.write(path, result)),
                kept(f"its plot {picture}", lambda: advice_plot.plot(result, picture)),
                args.json and kept(f"--json {args.json}", lambda: write_json_atomically(args.json, result))]
    written = ", ".join(str(file) for file, failed in zip((path, picture, args.json), failures) if file and not failed)
    full = result.get("full_bench")
    print(f"\nadvice {'kept in ' + written if written else 'not kept'}; the advice took {result['advise_s']:.0f} s "
          f"after start-up" + (f", its full bench {full['seconds']:.0f} s more" if full else ""), flush=True)
    precision_words = f" --precision {args.precision}" if args.precision != PRECISION_AUTO else ""
    print(f"train with it: python -m mpi_train {' '.join(model_flag_words(args))} --batch-size {args.batch_size}"
          f"{precision_words} {' '.join(result['recommended']['flags'])}"
          + ("   (or --sync auto, which reads the newest advice for this setting)" if path.exists() else ""),
          flush=True)
    if connection is not None:
        run_id = log_advice(connection, args.run_name or f"advice-{args.model}-np{result['world_size']}", result,
                            text, [picture] if picture.exists() else [])
        print(f"logged as MLflow run {run_id} in experiment {args.experiment!r}, a child run per candidate shown; "
              + where(connection.uri, connection.experiment_id, run_id, charts=True), flush=True)
    return unkept(failures, "The advisor measured its shortlist")


def main(argv: Sequence[str] | None = None) -> int:
    cluster = join_job(argv)
    args = build_parser(quiet=not cluster.info.is_main).parse_args(argv)
    return guarded(cluster, lambda: run(cluster, args), args.timeout)
