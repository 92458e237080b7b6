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
import copy
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from .. import netmodel, tracking
from ..advice import cache, memory_limit, search
from ..advice.search import Candidate, StepModel
from ..cluster import Cluster
from ..config import (
    ADVICE_DIR,
    BACKENDS,
    ENV_DEFAULTS,
    LAUNCHERS,
    TrainConfig,
    add_config_arguments,
    add_model_arguments,
    model_config,
    model_flag_words,
)
from ..data import synthetic_batch
from ..devices import place
from ..errors import UserError, folder_write_error
from ..files import write_json_atomically
from ..optimizers import describe_state, state_slots
from ..rankguard import RankAwareParser, guarded, join_job
from ..step.precision import PRECISION_AUTO, agreed
from ..sync import PARAMETERS, SYNC_METHODS, backend_error, every_label, split_label
from ..sync.averaging import STREAMED, STREAMED_COMPRESSIONS
from ..sync.base import AccuracyCost
from ..tracking import names as metric_names
from ..tracking.links import share_views, where
from .bench import NO_SYNC, Contender, NoSync, log_child, measure, pooled_backward, slowest

CALIBRATION_BYTES = 16 * 2**20  # the largest ping-pong message: enough to fit beta; larger only take longer
NOISE_FLOOR = 0.03  # the least share by which a measurement overturns the model's choice
FULL_BENCH_CHUNK = 5  # configurations measured side by side in --full-bench (each holds a replica of the model)
PROFILE_STEPS = 2  # timed steps of the model without sync, for the predictions that pick what to measure
SOURCE = "docs/results.md"


# (model, compression) -> the accuracy cost measured of a gradient method's compression; a method that averages
# models keeps its own (its class's accuracy_costs)
ACCURACY_COST = {
    ("vgg11", "fp16"): AccuracyCost(+0.62, "bucketed+fp16, CIFAR-10, one epoch, np 4, batch 256",
                                    f"{SOURCE}#what-each-lossy-option-costs-in-accuracy"),
    ("vgg11", "powersgd"): AccuracyCost(-1.78, "bucketed+powersgd rank 2 from step 101, CIFAR-10, one epoch, np 4",
                                        f"{SOURCE}#what-each-lossy-option-costs-in-accuracy"),
    ("mnist_cnn", "fp16"): AccuracyCost(+0.05, "bucketed+fp16, MNIST, one epoch, np 4, batch 256",
                                        f"{SOURCE}#what-each-lossy-option-costs-in-accuracy"),
    ("mnist_cnn", "powersgd"): AccuracyCost(+0.03, "bucketed+powersgd rank 2 from step 11, MNIST, one epoch, np 4",
                                            f"{SOURCE}#what-each-lossy-option-costs-in-accuracy"),
}


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    parser = RankAwareParser(prog="python -m mpi_train advise", quiet=quiet, description=__doc__.split("\n")[0])
    add_model_arguments(parser)  # the job's model (a job's --dataset synthetic or mnist trains mnist_cnn by default)
    parser.add_argument("--batch-size", type=int, default=256,
                        help="the job's global batch, split across ranks (default: 256)")
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
    parser.add_argument("--link", help="the link rate the hosts were shaped to (e.g. 100mbit): recorded, and the "
                                       "calibrated bandwidth between hosts is capped at it")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="auto",
                        help="what started the ranks (default: auto, detected)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="process-group backend (default: auto)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads per rank (default: this host's cores divided by its ranks)")
    parser.add_argument("--master-addr", default=None, help="rendezvous address (default: $MASTER_ADDR, else chosen)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a collective may wait (default: 300)")
    parser.add_argument("--tracking-uri", help="MLflow server or database (default: $MLFLOW_TRACKING_URI, else "
                                               "sqlite:///mlruns/mlflow.db)")
    parser.add_argument("--experiment", default="mpi_train",
                        help="MLflow experiment the advice run is filed under (default: mpi_train)")
    parser.add_argument("--run-name", help="name of the advice run (default: advice-MODEL-npN)")
    parser.add_argument("--no-tracking", action="store_true", help="do not record the advice in MLflow")
    return parser


def validate(args: argparse.Namespace, world: int) -> None:
    memory_limit.parse_size(args.memory_limit)
    if world < 2:
        raise UserError("the advisor compares ways of syncing ranks, and this job has one rank. Start it like the "
                        "training job, e.g. mpirun -np 4 --hostfile hostfile python -m mpi_train advise.")
    for flag, value in {"--batch-size": args.batch_size, "--steps": args.steps, "--measure": args.measure,
                        "--link-iters": args.link_iters, "--timeout": args.timeout}.items():
        if value <= 0:
            raise UserError(f"{flag} must be positive, got {value}.")
    if args.warmup < 0:
        raise UserError(f"--warmup must not be negative, got {args.warmup}.")
    if args.full_bench < 0:
        raise UserError(f"--full-bench takes the timed steps of the full bench, got {args.full_bench}; 0 skips it.")
    if args.link:
        try:
            netmodel.rate_bytes_per_s(args.link)
        except ValueError as error:
            raise UserError(f"--link: {error}.") from None
    if args.batch_size % world:
        raise UserError(f"--batch-size {args.batch_size} is the global batch and must split evenly across the {world} "
                        f"ranks. Use a multiple of {world}.")


# --- what is measured ------------------------------------------------------------------------

def calibration(cluster: Cluster, args: argparse.Namespace, largest: int, device) -> dict | None:
    """The links, on rank 0 (None elsewhere): the newest advice's on these hosts at this --link, unless --fresh,
    else measured now. Collective."""
    reused = None
    if cluster.info.is_main and not args.fresh:
        found = cache.reusable_calibration(args.advice_dir, cluster.hosts, args.link)
        if found:
            path, data = found
            reused = {**data["calibration"], "reused_from": str(path)}
    reused = cluster.bcast(reused)
    if reused:
        if cluster.info.is_main:
            print(f"advise: reusing the calibration of {reused['reused_from']}, measured "
                  f"{cache.age(time.time() - reused['measured_at_s'])} ago (--fresh measures again)", flush=True)
        return reused if cluster.info.is_main else None
    if cluster.info.is_main:
        print(f"advise: calibrating the links (ping-pong, 1 KB .. {largest / 1e6:.1f} MB)", flush=True)
    measured = netmodel.calibrate(cluster.hosts, largest, args.link_iters, device, args.link)
    if not cluster.info.is_main:
        return None
    network = netmodel.capped(netmodel.Network.from_dict(measured["network"]), args.link)
    return {**measured, "network": network.as_dict(), "measured_at_s": time.time(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "reused_from": None}


def contender(name: str, method, template) -> Contender:
    model = copy.deepcopy(template)
    return Contender(name, method, model, method.wrap(model), method.overlapped())


def step_model(per_rank: list[dict], tensor_bytes: Sequence[float], layout: netmodel.Layout,
               network: netmodel.Network, backward: netmodel.Backward,
               units: Sequence[int] | None = None) -> StepModel:
    """The step without sync as measured (slowest rank per step, median), with the links and backward's profile
    (and each tensor's layer block, `units`: fsdp's messages)."""
    return StepModel(tuple(tensor_bytes), layout, network, backward,
                     statistics.median(slowest(per_rank, NO_SYNC, "compute")),
                     statistics.median(slowest(per_rank, NO_SYNC, "step")), tuple(units) if units else None)


def measured_steps(per_rank: list[dict]) -> dict[str, dict]:
    """Per contender: its step and its step minus the no-sync step of the same round (slowest rank, medians), and
    each timed step."""
    baseline = slowest(per_rank, NO_SYNC, "step")
    found = {}
    for name in per_rank[0]:
        steps = slowest(per_rank, name, "step")
        found[name] = {"step_s": statistics.median(steps),
                       "exposed_s": statistics.median(s - b for s, b in zip(steps, baseline)), "steps_s": steps}
    return found


def full_bench_check(grid: Sequence[Candidate], per_rank: list[dict], seconds: float, model: StepModel,
                     recommended: str, steps: int) -> dict:
    """The advice held against a full bench of the same setting: each configuration's predicted and measured step;
    the regret (the recommendation's measured step over the fastest measured, less 1); Kendall's tau of predicted
    against measured over every configuration, and over the methods (each at its best predicted configuration)."""
    measured = measured_steps(per_rank)
    rows = [{"label": c.label, "sync": c.sync, "bucket_mb": c.bucket_mb,
             "predicted_step_s": search.predicted(c, model).step_s, "measured_step_s": measured[c.label]["step_s"],
             "measured_steps_s": measured[c.label]["steps_s"]} for c in grid]
    rows.sort(key=lambda row: row["measured_step_s"])
    by_label = {row["label"]: row for row in rows}
    best, mine = rows[0], by_label[recommended]
    each = {}
    for row in sorted(rows, key=lambda row: row["predicted_step_s"]):
        each.setdefault(row["sync"], row)
    default = by_label.get(Candidate(mine["sync"], search.DEFAULT_BUCKET_MB).label) if mine["bucket_mb"] else None

    def tau(chosen: Sequence[dict]) -> float | None:
        return search.kendall_tau([r["predicted_step_s"] for r in chosen], [r["measured_step_s"] for r in chosen])

    return {"steps": steps, "seconds": seconds, "configurations": rows, "fastest": best["label"],
            "recommended": recommended, "regret": mine["measured_step_s"] / best["measured_step_s"] - 1,
            "kendall_tau": tau(rows), "kendall_tau_methods": tau(list(each.values())),
            "methods": [row["label"] for row in each.values()],
            "default_bucket_step_s": default["measured_step_s"] if default else None,
            "no_sync_step_s": measured[NO_SYNC]["step_s"]}


def describe_full_bench(check: dict) -> list[str]:
    """The full bench's table and what it says of the advice."""
    rows = [{**row, "flags": Candidate(row["sync"], row["bucket_mb"]).flags, "predicted_exposed_s": None,
             "binds": ""} for row in check["configurations"]]
    mine = next(row for row in rows if row["label"] == check["recommended"])
    lines = ["", (f"full bench: {len(rows)} lossless configurations, {check['steps']} timed step(s) each, "
                  f"{check['seconds']:.0f} s (no sync {check['no_sync_step_s'] * 1e3:,.0f} ms a step)"),
             table(rows),
             (f"the recommendation, {check['recommended']}, measured {mine['measured_step_s'] * 1e3:,.0f} ms "
              f"here; the fastest, {check['fastest']}, {rows[0]['measured_step_s'] * 1e3:,.0f} ms: regret "
              f"{check['regret']:+.1%}")]
    if check["default_bucket_step_s"] is not None:
        lines.append(f"its bucket size against the default {search.DEFAULT_BUCKET_MB:g} MB: "
                     f"{mine['measured_step_s'] * 1e3:,.0f} against {check['default_bucket_step_s'] * 1e3:,.0f} ms")
    lines.append("Kendall's tau, predicted against measured: "
                 + (f"{check['kendall_tau_methods']:.2f} over the methods ({', '.join(check['methods'])}), "
                    if check["kendall_tau_methods"] is not None else "")
                 + (f"{check['kendall_tau']:.2f} over every configuration" if check["kendall_tau"] is not None
                    else ""))
    return lines


# --- what is reported ------------------------------------------------------------------------

def option_of(text: str) -> str:
    """What a lossy label is listed by: its compression, or a model-averaging method (with its compression, if
    any)."""
    name, compression = split_label(text)
    method = SYNC_METHODS[name]
    if method.averages == PARAMETERS:
        return name if compression == "none" else text
    return method.compression_name(compression)


def configured(text: str):
    """The method a label names, as a job with its defaults configures it (`bucketed+fp16`, `localsgd+fp16
    --overlap`, `localsgd+fp16 --overlap --fragments 4`)."""
    streamed = next((suffix for suffix in STREAMED if text.endswith(suffix)), "")  # (no suffix ends another)
    name, compression = split_label(text.removesuffix(streamed))
    return SYNC_METHODS[name].from_config(TrainConfig(sync=name, compression=compression,
                                                      **STREAMED.get(streamed, {})))


def accuracy_cost(model_name: str, text: str) -> AccuracyCost | None:
    """The accuracy cost measured for a lossy label on this model: a model-averaging method's own (its class), else
    its compression's (ACCURACY_COST)."""
    name, compression = split_label(text)
    method = SYNC_METHODS[name]
    if method.averages == PARAMETERS:
        return method.accuracy_costs.get((model_name, compression))
    return ACCURACY_COST.get((model_name, method.compression_name(compression)))


def measured_settings(method_class, cost: AccuracyCost | None) -> dict:
    """The settings a model-averaging option's accuracy cost was measured with (`--host-period 1`, `--period 4`):
    the option is priced and flagged as measured, not at the defaults. A compression's cost keeps the defaults."""
    return dict(cost.settings) if cost and method_class.averages == PARAMETERS else {}


def option_flags(name: str, compression: str, settings: dict) -> list[str]:
    """An option as a job's flags: its method, its compression unless none, and the TrainConfig settings its
    accuracy was measured with (`--sync localsgd --compression fp16 --host-period 1`)."""
    return (["--sync", name] + (["--compression", compression] if compression != "none" else [])
            + [word for field, value in settings.items() for word in ("--" + field.replace("_", "-"), str(value))])


def lossy_options(model_name: str, params, model: StepModel, backend: str) -> tuple[list[dict], list[tuple]]:
    """Every lossy label with its predicted step (the wire only: a compressor's CPU work is left out) and its
    measured accuracy cost; and those the backend cannot run, with the reason."""
    rows, refused = [], []
    for text in every_label():
        name, compression = split_label(text)
        method_class = SYNC_METHODS[name]
        if compression == "none" and not method_class.fixed_compression and method_class.averages != PARAMETERS:
            continue
        why = backend_error(name, backend)
        if why:
            refused.append((text, why))
            continue
        cost = accuracy_cost(model_name, text)
        measured = measured_settings(method_class, cost)
        method = method_class.from_config(TrainConfig(sync=name, compression=compression, **measured))
        prediction = netmodel.predict(method, model.tensor_bytes, model.layout, model.network, label=text,
                                      ratio=method.wire_ratio(params), later=method.later_share(params),
                                      backward_s=model.backward_s,
                                      backward=model.backward, units=model.units)
        if prediction is None:
            continue
        rows.append({"label": text, "option": option_of(text),
                     "flags": option_flags(name, compression, measured),
                     "predicted_step_s": model.baseline_step_s + prediction.sync_s,
                     "accuracy_points": cost.points if cost else None,
                     "accuracy_measured": f"{cost.measured}; {cost.source}" if cost else None})
        if method_class.averages == PARAMETERS and compression in STREAMED_COMPRESSIONS:
            rows.extend(overlapped_option(model_name, params, model, text, streamed) for streamed in STREAMED)
    return sorted(rows, key=lambda row: row["predicted_step_s"]), refused


def overlapped_option(model_name: str, params, model: StepModel, text: str, streamed: str) -> dict:
    """A model-averaging label with its averages in the background (`streamed`: --overlap, and in fragments): free
    while each fits in the local steps until the next, else what outlasts them; its accuracy cost as its class
    lists it (key: the compression and `streamed`), if measured."""
    name, compression = split_label(text)
    method_class = SYNC_METHODS[name]
    cost = method_class.accuracy_costs.get((model_name, compression + streamed))
    measured = measured_settings(method_class, cost)
    method = method_class.from_config(TrainConfig(sync=name, compression=compression, **STREAMED[streamed],
                                                  **measured))
    prediction = netmodel.predict(method, model.tensor_bytes, model.layout, model.network, label=text,
                                  ratio=method.wire_ratio(params), later=method.later_share(params),
                                  backward_s=model.backward_s,
                                  backward=model.backward, compute_s=model.compute_s, units=model.units)
    return {"label": text + streamed, "option": option_of(text) + streamed,
            "flags": option_flags(name, compression, measured) + streamed.split(),
            "predicted_step_s": model.baseline_step_s + prediction.sync_s,
            "accuracy_points": cost.points if cost else None,
            "accuracy_measured": f"{cost.measured}; {cost.source}" if cost else None}


def bench_noise(no_sync_steps: Sequence[float]) -> float:
    """How far the short bench's own steps stray: the no-sync step's range over its median (nothing but compute and
    the machine's other work changes it), at least NOISE_FLOOR."""
    median = statistics.median(no_sync_steps)
    return max(NOISE_FLOOR, (max(no_sync_steps) - min(no_sync_steps)) / median if median > 0 else 0.0)


def recommendation(rows: dict[str, dict], first_choice: str, model: StepModel, noise: float = NOISE_FLOOR) -> dict:
    """The model's first choice, unless another configuration measured faster by more than the bench's noise (a
    share): a difference of a step or two smaller than that says more about the machine than about the methods."""
    measured = {key: row for key, row in rows.items() if row.get("measured_step_s") is not None}
    fastest = min(measured.values(), key=lambda row: row["measured_step_s"])
    first = rows[first_choice]
    overturned = fastest["measured_step_s"] < first["measured_step_s"] * (1 - noise)
    best = fastest if overturned else first
    step, exposed = best["measured_step_s"], best["predicted_exposed_s"]
    hidden = max(0.0, best["predicted_comm_s"] - exposed)
    why = [f"{best['label']} is predicted at {best['predicted_step_s'] * 1e3:,.0f} ms per step: "
           f"{model.baseline_step_s * 1e3:,.0f} ms without sync (forward and backward) + "
           f"{exposed * 1e3:,.0f} ms of exposed communication ({best['predicted_comm_s'] * 1e3:,.0f} ms of messages"
           + (f", {hidden * 1e3:,.0f} ms of them hidden behind backward" if hidden > 5e-4 else "")
           + f"); what binds: {best['binds']}",
           f"measured {step * 1e3:,.0f} ms per step"
           + (f", the fastest of the {len(measured)} measured" if best is fastest else "")]
    if best is not first:
        why.append(f"the model's first choice, {first_choice}, measured {first['measured_step_s'] * 1e3:,.0f} ms, "
                   f"slower by more than the bench's noise ({noise:.0%})")
    elif fastest is not first:
        why.append(f"{fastest['label']} measured {fastest['measured_step_s'] * 1e3:,.0f} ms, within the bench's noise "
                   f"({noise:.0%}, the no-sync step's range over its median): not enough to overturn the model")
    reference = rows.get(search.REFERENCE)
    if reference and reference is not best and reference.get("measured_step_s"):
        why.append(f"ddp measured {reference['measured_step_s'] * 1e3:,.0f} ms "
                   f"({reference['measured_step_s'] / step:.2f}x this step)")
    if best["bucket_mb"] is not None and best["bucket_mb"] != search.DEFAULT_BUCKET_MB:
        default = rows.get(Candidate(best["sync"], search.DEFAULT_BUCKET_MB).label) or {}
        if default.get("measured_step_s"):
            why.append(f"its {best['bucket_mb']:g} MB buckets against the default {search.DEFAULT_BUCKET_MB:g} MB: "
                       f"{step * 1e3:,.0f} against {default['measured_step_s'] * 1e3:,.0f} ms measured, "
                       f"{best['predicted_step_s'] * 1e3:,.0f} against {default['predicted_step_s'] * 1e3:,.0f} ms "
                       f"predicted")
    return {key: best[key] for key in ("label", "sync", "bucket_mb", "flags", "predicted_step_s",
                                       "predicted_exposed_s", "measured_step_s", "binds")} | {
        "baseline_step_s": model.baseline_step_s, "why": "; ".join(why) + "."}


def table(rows: Sequence[dict]) -> str:
    columns = ("candidate", "flags", "predicted_ms", "exposed_ms", "measured_ms", "mem_MiB", "binds")

    def cell(row: dict, column: str) -> str:
        if column == "candidate":
            return row["label"]
        if column == "flags":
            return " ".join(row["flags"])
        if column == "binds":
            return row["binds"]
        if column == "mem_MiB":  # memory per rank, predicted (netmodel/memory.py)
            held = row.get("predicted_memory_bytes")
            return "-" if held is None else f"{held / 2**20:,.1f}"
        value = row[{"predicted_ms": "predicted_step_s", "exposed_ms": "predicted_exposed_s",
                     "measured_ms": "measured_step_s"}[column]]
        return "-" if value is None else f"{value * 1e3:,.1f}"

    cells = [list(columns)] + [[cell(row, column) for column in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(value.ljust(width) if i in (0, 1, 6) else value.rjust(width)
                       for i, (value, width) in enumerate(zip(line, widths))).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def describe(result: dict) -> str:
    """The advice as printed and stored: the setting, the links, the table, the recommendation, the lossy options."""
    setting = cache.Setting.of(result)
    links = result["calibration"]
    source = (f"of {links['reused_from']}, measured {cache.age(result['created_s'] - links['measured_at_s'])} before"
              if links.get("reused_from") else "measured now")
    network = netmodel.Network.from_dict(links["network"])
    search_note = result["search"]
    shown = [row for row in result["candidates"] if row["shown"]]
    recommended = result["recommended"]
    lines = [
        f"advice for {setting.describe()}, backend {result['backend']}"
        + (f", link {result['link']}" if result.get("link") else "")
        + f": {result['gradient_bytes'] / 1e6:.1f} MB of gradients in {result['tensors']} tensors",
        f"links ({source}): {netmodel.describe_network(network)}",
        (f"step without sync {result['baseline_step_s'] * 1e3:,.1f} ms (forward + backward "
         f"{result['compute_s'] * 1e3:,.1f} ms in {result.get('precision', cache.UNNAMED_PRECISION)}, backward "
         f"{result['backward_share']:.2f} of it), slowest rank"),
        f"searched {search_note['configurations']} lossless configurations: "
        + ", ".join(search_note["methods"])
        + (f"; {', '.join(search_note['bucket_tuned'])} at {len(search_note['bucket_sizes_mb'])} bucket sizes "
           f"({search_note['bucket_sizes_mb'][0]:g} .. {search_note['bucket_sizes_mb'][-1]:g} MB)"
           if search_note["bucket_tuned"] else ""),
        *([(f"memory per rank at most {memory_limit.size(result['memory_limit_bytes'])} (--memory-limit; the "
            f"model's parameters, gradients and {describe_state(result.get('optimizer', 'sgd'), result['momentum'])}, "
            f"mem_MiB below)")]
          if result.get("memory_limit_bytes") else []),
        "",
        table(shown),
        (f"(each method at its best predicted configuration, and every one measured; measured = the short bench, "
         f"{result['bench']['steps']} timed step(s) after {result['bench']['warmup']} warm-up, slowest rank, median)"),
    ]
    if result.get("kendall_tau") is not None:
        lines.append(f"Kendall's tau between predicted and measured step over the {len(result['measured'])} measured: "
                     f"{result['kendall_tau']:.2f}")
    for name, why in result["unavailable"]:
        lines.append(f"unavailable: {name}: {why}")
    for name, why in result.get("over_memory_limit", []):
        lines.append(f"left out: {name}: {why}")
    lines += ["", f"recommended: {' '.join(recommended['flags'])}",
              (f"  predicted {recommended['predicted_step_s'] * 1e3:,.0f} ms per step, measured "
               f"{recommended['measured_step_s'] * 1e3:,.0f} ms"),
              f"  why: {recommended['why']}", "",
              ("lossy options, never chosen here: each changes what the model learns. Each at its fastest predicted "
               "schedule (the wire only, not a compressor's CPU work; every schedule is in the JSON):")]
    lines += lossy_table(result["lossy"])
    for name, why in result["lossy_unavailable"]:
        lines.append(f"unavailable: {name}: {why}")
    if result.get("full_bench"):
        lines += describe_full_bench(result["full_bench"])
    return "\n".join(lines)


def lossy_table(rows: Sequence[dict]) -> list[str]:
    """Each lossy option at its fastest predicted schedule, with the accuracy cost measured and where (numbered)."""
    fastest: dict[str, dict] = {}
    for row in rows:  # (fastest first)
        fastest.setdefault(row["option"], row)
    sources = list(dict.fromkeys(row["accuracy_measured"] for row in fastest.values() if row["accuracy_measured"]))
    cells = [("option", "flags", "predicted_ms", "accuracy against allreduce")] + [
        (option, " ".join(row["flags"]), f"{row['predicted_step_s'] * 1e3:,.1f}",
         f"{row['accuracy_points']:+.2f} points [{sources.index(row['accuracy_measured']) + 1}]"
         if row["accuracy_measured"] else "not measured") for option, row in fastest.items()]
    widths = [max(len(line[i]) for line in cells) for i in range(4)]
    lines = [f"{a.ljust(widths[0])}  {b.ljust(widths[1])}  {c.rjust(widths[2])}  {d}" for a, b, c, d in cells]
    return lines + [f"  [{number}] {source}" for number, source in enumerate(sources, 1)]


def plot(result: dict, path: Path) -> Path:
    """Predicted step against bucket size for each method that follows --bucket-mb, the other methods' predictions
    as lines, and every measured step as a point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["candidates"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axis = plt.subplots(figsize=(9, 5.5))
    for index, name in enumerate(result["search"]["bucket_tuned"]):
        color = colors[index % len(colors)]
        curve = sorted((row["bucket_mb"], row["predicted_step_s"]) for row in rows if row["sync"] == name)
        axis.plot([x for x, _ in curve], [1e3 * y for _, y in curve], color=color, drawstyle="steps-pre",
                  label=f"{name}: predicted")
        measured = [(row["bucket_mb"], row["measured_step_s"]) for row in rows
                    if row["sync"] == name and row["measured_step_s"] is not None]
        axis.scatter([x for x, _ in measured], [1e3 * y for _, y in measured], color=color, marker="o", zorder=3,
                     label=f"{name}: measured")
    others = [row for row in rows if row["bucket_mb"] is None]
    for index, row in enumerate(others, len(result["search"]["bucket_tuned"])):  # a line each, measured at the right
        color = colors[index % len(colors)]
        axis.axhline(1e3 * row["predicted_step_s"], color=color, linestyle=("--", "-.", ":")[index % 3], linewidth=1,
                     label=f"{row['label']}: predicted")
        if row["measured_step_s"] is not None:
            axis.scatter([result["search"]["bucket_sizes_mb"][-1]], [1e3 * row["measured_step_s"]], color=color,
                         marker="s", zorder=3, label=f"{row['label']}: measured")
    axis.axvline(search.DEFAULT_BUCKET_MB, color="grey", linewidth=0.8, linestyle=":")
    axis.set(xscale="log", xlabel="bucket size (MB)", ylabel="step (ms)",
             title=f"{result['model']}, batch {result['batch_size']}, {result['world_size']} ranks: recommended "
                   f"{' '.join(result['recommended']['flags'])}")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def link_text(link: netmodel.Link) -> str:
    return f"{link.alpha * 1e6:.0f} us + m / {link.bandwidth / 1e6:,.1f} MB/s"


def log_run(connection: tracking.Connection, run_name: str, result: dict, text: str, files: Sequence[Path]) -> str:
    """Rank 0: the advice as a parent run (hosts and links as params; the JSON, table and plot as artifacts) with a
    child run per candidate shown, its predicted and measured step as metrics, as the bench logs its methods."""
    from mlflow.entities import Metric, Param

    client, experiment = connection.client, connection.experiment_id
    recommended = " ".join(result["recommended"]["flags"])
    run_id = client.create_run(experiment, run_name=run_name, tags={
        "mpi_train.role": "advice", "mpi_train.recommended": recommended}).info.run_id
    children = []
    try:
        network = netmodel.Network.from_dict(result["calibration"]["network"])
        layout = result["layout"]
        links = result["calibration"]
        params = {"model": result["model"], "batch_size": result["batch_size"], "world_size": result["world_size"],
                  "backend": result["backend"], "precision": result["precision"],
                  "hosts": ",".join(dict.fromkeys(result["hosts"])),
                  "num_hosts": layout["hosts"], "ranks_per_host": layout["ranks_per_host"],
                  "link": result.get("link") or "unlimited", "recommended": recommended,
                  "link_between_hosts": link_text(network.inter), "link_within_host": link_text(network.intra),
                  "calibration": f"reused from {links['reused_from']}" if links.get("reused_from") else "measured"}
        stamp = int(time.time() * 1000)
        figures = {"kendall_tau": result.get("kendall_tau"), "calibration_age_s": result["calibration_age_s"],
                   "recommended_predicted_step_s": result["recommended"]["predicted_step_s"],
                   "recommended_measured_step_s": result["recommended"]["measured_step_s"]}
        client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()],
                         metrics=[Metric(metric_names.advice_key(k), float(v), stamp, 0) for k, v in figures.items()
                                  if v is not None], synchronous=True)
        client.log_dict(run_id, result, "advice.json")
        client.log_text(run_id, text + "\n", "advice.txt")
        for path in files:
            client.log_artifact(run_id, str(path))
        setting = f"np{result['world_size']}" + (f"-h{layout['hosts']}-{result['link']}" if result.get("link") else "")
        for row in (row for row in result["candidates"] if row["shown"]):
            values = {key: row[key] for key in ("predicted_step_s", "predicted_exposed_s", "measured_step_s",
                                                "measured_exposed_s") if row.get(key) is not None}
            children.append(log_child(
                client, experiment, run_id, f"{row['label']}-{setting}", "advice_candidate",
                {metric_names.advice_key(k): v for k, v in values.items()},
                {"sync": row["sync"], "compression": "none", "bucket_mb": row["bucket_mb"] or "-",
                 "flags": " ".join(row["flags"]), "world_size": result["world_size"], "model": result["model"],
                 "batch_size": result["batch_size"]}, stamp))
    except BaseException:
        for failed in [*children, run_id]:
            client.set_terminated(failed, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    share_views(client, experiment)
    return run_id


# --- the program -----------------------------------------------------------------------------

def run(cluster: Cluster, args: argparse.Namespace) -> None:
    info, world = cluster.info, cluster.info.world_size
    validate(args, world)
    unwritable = folder_write_error(Path(args.advice_dir)) if info.is_main else None
    cluster.agree(unwritable and f"cannot keep advice in {args.advice_dir}: {unwritable}. Give a folder this user "
                                 f"can write with --advice-dir", "python -m mpi_train advise")
    uri = args.tracking_uri or os.environ.get(ENV_DEFAULTS["tracking_uri"]) or None
    workload = model_config(args, batch_size=args.batch_size, tracking_uri=uri, experiment=args.experiment,
                            no_tracking=args.no_tracking, optimizer=args.optimizer)
    connection = tracking.connect(workload, cluster)
    placement = place(cluster, args.backend, args.threads)
    backend, device = placement.backend, placement.device
    precision = agreed(args.precision, device, cluster).name  # auto: what the job would run here
    cluster.open_process_group(backend, args.master_addr, args.timeout, device)
    started = time.perf_counter()

    torch.manual_seed(0)
    template = workload.make_model().to(device).train()
    tensor_bytes = netmodel.tensor_sizes(template)
    units = netmodel.tensor_units(template)
    gradient_bytes = int(sum(tensor_bytes))
    layout = netmodel.Layout.of_hosts(list(cluster.hosts))
    setting = cache.Setting(tuple(cluster.hosts), args.model, args.batch_size, args.precision)
    if info.is_main:
        print(f"advise: {setting.describe()}, backend {backend}, {placement.threads} thread(s) per rank", flush=True)
    links = calibration(cluster, args, min(gradient_bytes, CALIBRATION_BYTES), device)
    images, labels = (part.to(device) for part in synthetic_batch(workload, args.batch_size // world))

    def progress(what: str):
        def say(step: int, total: int, warming: bool) -> None:
            if info.is_main:
                print(f"advise: {what} step {step}/{total}{'  (warm-up)' if warming else ''}", flush=True)
        return say

    if info.is_main:
        print(f"advise: timing {workload.describe_model()}'s forward and backward without sync ({PROFILE_STEPS} "
              f"steps)", flush=True)
    times, order = measure([contender(NO_SYNC, NoSync(), template)], images, labels, PROFILE_STEPS, 1, device,
                           progress("no-sync"), precision)
    profile = cluster.gather(times)
    usable, refused = search.lossless(backend)
    found = search.candidates(usable, tensor_bytes, order)
    limit, settings = memory_limit.parse_size(args.memory_limit), workload.optimizer_settings
    found, over_limit, held = memory_limit.fitting(found, template, world, state_slots(settings), limit)
    chosen = None
    if info.is_main:
        network = netmodel.Network.from_dict(links["network"])
        backward = pooled_backward(profile, order)  # every rank's, as the bench's
        first = search.ranked(found, step_model(profile, tensor_bytes, layout, network, backward, units))
        chosen = [candidate.as_dict() for candidate in search.shortlist(first, args.measure)]
        print(f"advise: predicted {len(found)} lossless configurations; measuring "
              f"{', '.join(c['label'] for c in chosen)} ({args.steps} timed step(s) after {args.warmup} warm-up)",
              flush=True)
    chosen = [Candidate.from_dict(one) for one in cluster.bcast(chosen)]
    entries = [contender(NO_SYNC, NoSync(), template)] + [contender(c.label, c.method(), template) for c in chosen]
    times, _ = measure(entries, images, labels, args.steps, args.warmup, device, progress("bench"), precision)
    per_rank = cluster.gather(times)
    advised_s = time.perf_counter() - started  # what the advice itself took, a full bench left out
    full = None
    if args.full_bench:
        grid = search.full_grid(found, chosen)
        if info.is_main:
            print(f"advise: full bench of {len(grid)} lossless configurations ({args.full_bench} timed step(s) "
                  f"after {args.warmup} warm-up each)", flush=True)
        merged: dict[str, dict[str, list[float]]] = {}
        for first in range(0, len(grid), FULL_BENCH_CHUNK):  # a few replicas at a time: 8 ranks on one machine fit
            chunk = grid[first:first + FULL_BENCH_CHUNK]
            entries = [contender(NO_SYNC, NoSync(), template)] + [contender(c.label, c.method(), template)
                                                                  for c in chunk]
            times, _ = measure(entries, images, labels, args.full_bench, args.warmup, device,
                               progress(f"full bench {first + 1}-{first + len(chunk)} of {len(grid)}"), precision)
            for name, phases in times.items():
                for phase, values in phases.items():
                    merged.setdefault(name, {}).setdefault(phase, []).extend(values)
        full = (grid, cluster.gather(merged), time.perf_counter() - started - advised_s)
    dist.destroy_process_group()
    if not info.is_main:
        return

    model = step_model(per_rank, tensor_bytes, layout, network, backward, units)
    ranking = search.ranked(list(dict.fromkeys([*found, *chosen])), model)
    measured = measured_steps(per_rank)
    shown = {one.candidate.label for one in search.best_of_each(ranking)} | {c.label for c in chosen}
    rows = {}
    for one in ranking:
        taken = measured.get(one.candidate.label)
        rows[one.candidate.label] = {
            **one.as_dict(), "shown": one.candidate.label in shown,
            "measured_step_s": taken["step_s"] if taken else None,
            "measured_exposed_s": taken["exposed_s"] if taken else None,
            "measured_steps_s": taken["steps_s"] if taken else None,
            "predicted_memory_bytes": held.get(one.candidate.label)}
    timed = [rows[c.label] for c in chosen]
    noise = bench_noise(measured[NO_SYNC]["steps_s"])
    tau = search.kendall_tau([row["predicted_step_s"] for row in timed], [row["measured_step_s"] for row in timed])
    params = [p for p in template.parameters() if p.requires_grad]
    lossy, lossy_refused = lossy_options(args.model, params, model, backend)
    lossy_held = memory_limit.held_per_rank({row["label"]: configured(row["label"]) for row in lossy}, template,
                                            world, state_slots(settings))
    lossy_refused += [(row["label"], why) for row in lossy if (why := memory_limit.over(row["label"], lossy_held,
                                                                                       limit))]
    lossy = [row for row in lossy if not memory_limit.over(row["label"], lossy_held, limit)]
    created = time.time()
    bucketed = sorted({one.candidate.sync for one in ranking if one.candidate.bucket_mb is not None})
    sizes = sorted({one.candidate.bucket_mb for one in ranking if one.candidate.bucket_mb is not None})
    result = {
        "kind": cache.KIND, "version": cache.VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_s": created, "hosts": list(cluster.hosts), "world_size": world, "model": args.model,
        "batch_size": args.batch_size, "backend": backend, "threads": placement.threads, "link": args.link,
        "precision": precision, "precision_flag": args.precision,
        "layout": {"hosts": layout.hosts, "ranks_per_host": layout.ranks_per_host},
        "gradient_bytes": gradient_bytes, "tensors": len(tensor_bytes),
        "calibration": {**links, "backward": backward.as_dict()},
        "calibration_age_s": created - links["measured_at_s"],
        "compute_s": model.compute_s, "baseline_step_s": model.baseline_step_s, "backward_share": backward.share,
        "search": {"configurations": len(found), "methods": usable, "bucket_tuned": bucketed, "bucket_sizes_mb": sizes},
        "bench": {"steps": args.steps, "warmup": args.warmup, "no_sync_steps_s": measured[NO_SYNC]["steps_s"]},
        "measured": [c.label for c in chosen], "kendall_tau": tau,
        "candidates": list(rows.values()),
        "bench_noise": noise,
        # (the shortlist's first is the model's choice)
        "recommended": recommendation(rows, chosen[0].label, model, noise),
        "lossy": lossy, "unavailable": refused, "lossy_unavailable": lossy_refused, "advise_s": advised_s,
        "memory_limit_bytes": limit, "momentum": settings.momentum, "optimizer": settings.optimizer,
        "over_memory_limit": over_limit,
    }
    if full is not None:
        result["full_bench"] = full_bench_check(*full, model, result["recommended"]["label"], args.full_bench)
    text = describe(result)
    print(text, flush=True)
    kept = cache.write(args.advice_dir, setting, result)
    picture = plot(result, kept.with_suffix(".png"))
    if args.json:
        write_json_atomically(args.json, result)
    print(f"\nadvice kept in {kept} (plot {picture})" + (f" and written to {args.json}" if args.json else "")
          + f"; the advice took {advised_s:.0f} s after start-up"
          + (f", its full bench {result['full_bench']['seconds']:.0f} s more" if full else ""))
    precision_words = f" --precision {args.precision}" if args.precision != PRECISION_AUTO else ""
    print(f"train with it: python -m mpi_train {' '.join(model_flag_words(args))} --batch-size {args.batch_size}"
          f"{precision_words} {' '.join(result['recommended']['flags'])}   (or --sync auto, which reads the newest "
          f"advice for this setting)", flush=True)
    if connection is not None:
        run_id = log_run(connection, args.run_name or f"advice-{args.model}-np{world}", result, text, [picture])
        print(f"logged as MLflow run {run_id} in experiment {args.experiment!r}, a child run per candidate shown; "
              + where(connection.uri, connection.experiment_id, run_id, charts=True), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    cluster = join_job(argv)
    args = build_parser(quiet=not cluster.info.is_main).parse_args(argv)
    return guarded(cluster, lambda: run(cluster, args), args.timeout)
