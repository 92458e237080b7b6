"""`python -m mpi_train gpu-check`: what a GPU machine must show before its figures are trusted, in one table.

    python -m mpi_train gpu-check --data-dir data --precision bf16-mixed --compile     # one GPU, one rank
    mpirun -np 8 python -m mpi_train gpu-check --data-dir data                         # a rank per GPU

`--sync ddp`'s steady step is timed against a bare PyTorch loop (pytorch/examples' shape: the batch already on the
GPU, forward, backward, the optimizer's step) in the same process, both under --precision and, with --compile, both
compiled; the same job in 32-true eagerly gives the speed-up of the precision and the compile, samples (tokens) per
second against samples per second. With --data-dir, one real CIFAR-10 epoch trains on the resident data path under
--precision, eagerly, its training time held against steps x the eager bare step and its accuracy against the CPU's
63% +- 3 points. For a compiled conv net the bare loop is timed with its weights channels_last and without: the one
a compiled job picks must be the faster. Every sync method with every compression it carries trains a few steps
under --precision, those of --float16-methods under 16-mixed too, and a job checkpointed part-way resumes to the
same weights bit for bit (--deterministic), under --precision and under 16-mixed (its loss scale with it). --parts
runs some of these (a GPU machine's script runs them in several processes, each under its own time limit).
Each row prints as it comes (`gpu-check: ok ...`); rank 0 prints the table at the end, and the exit status is 1 when
a check fails. On CPUs (`--backend gloo`) it dry-runs its own code with whatever model is named.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from ..benchmark.gpu import (
    FLOAT16,
    FLOAT16_METHODS,
    PARTS,
    REFERENCE,
    SPEEDUP_TARGET,
    WARM_STEPS,
    Checks,
    machine,
    method_names,
    table,
)
from ..benchmark.job import unkept
from ..cluster import Cluster
from ..config import add_config_arguments, add_model_arguments
from ..config.command_line import parse_config
from ..devices import place
from ..errors import UserError
from ..files import kept, unwritable, write_json_atomically
from ..rankguard import RankAwareParser, guarded, join_job


def parse_args(argv: list[str] | None, quiet: bool = False) -> argparse.Namespace:
    parser = RankAwareParser(prog="python -m mpi_train gpu-check", description=__doc__.split("\n\n")[0], quiet=quiet)
    parser.add_argument("--data-dir", help="CIFAR-10 for the one-epoch check (left out without it)")
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"), help="nccl (default); gloo dry-runs "
                        "the check on CPUs")
    add_model_arguments(parser, dataset=False)  # every job trains synthetic data shaped for it (CIFAR-10's epoch aside)
    add_config_arguments(parser, ("precision", "compile", "compile_mode"), helps={
        "compile": "compile the step against the bare loop: the ddp job (torch's compiled DDP) and the bare loop "
                   "alike; the other jobs train eagerly"})
    parser.add_argument("--batch-size", type=int, default=256, help="global batch (default: 256)")
    parser.add_argument("--steps", type=int, default=6, help="steps of each method's short job (default: 6)")
    parser.add_argument("--timed-steps", type=int, default=60, help="steps the bare loop and ddp are timed over "
                        f"(default: 60, after {WARM_STEPS} untimed)")
    parser.add_argument("--methods", help="comma-separated --sync names (default: all)")
    parser.add_argument("--float16-methods", default=FLOAT16_METHODS,
                        help=f"comma-separated --sync names that also train a few steps under {FLOAT16}, beside a "
                             f"resume under it; an empty string skips them (default: {FLOAT16_METHODS})")
    parser.add_argument("--speedup-target", type=float, default=SPEEDUP_TARGET,
                        help=f"the least samples/s (tokens/s) under --precision and --compile against {REFERENCE} "
                             f"eager, both timed as ddp's step (default: {SPEEDUP_TARGET:g})")
    parser.add_argument("--epoch-steps", type=int, help="stop the CIFAR-10 epoch after this many steps: a dry run's "
                        "(its accuracy is then no check; default: the whole epoch)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts of the check to run, in this order: {', '.join(PARTS)} "
                             f"(default: all)")
    parser.add_argument("--json", help="also write the table's rows here (rank 0)")
    return parser.parse_args(argv)


def chosen_parts(args: argparse.Namespace) -> list[str]:
    """The flags refused up front, on every rank alike, before any job trains; the parts --parts names."""
    if args.backend == "nccl" and not torch.cuda.is_available():
        raise UserError("the GPU check runs under NCCL and this machine has no CUDA device torch can use. Run it on "
                        "a GPU machine, or dry-run its code on CPUs with --backend gloo.", collective=True)
    for flag, value in {"--batch-size": args.batch_size, "--steps": args.steps, "--timed-steps": args.timed_steps,
                        "--epoch-steps": args.epoch_steps or 1, "--speedup-target": args.speedup_target}.items():
        if value <= 0:
            raise UserError(f"{flag} must be positive, got {value}.", collective=True)
    method_names(args.methods, "--methods")
    method_names(args.float16_methods, "--float16-methods")
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if not parts or set(parts) - set(PARTS):
        raise UserError(f"--parts {args.parts!r} names {', '.join(sorted(set(parts) - set(PARTS))) or 'no part'}; "
                        f"name parts of {', '.join(PARTS)}, comma-separated.", collective=True)
    return parts


def check_paths(cluster: Cluster, args: argparse.Namespace, parts: list[str]) -> None:
    """--data-dir (read by every rank) and --json (written by rank 0) refused before the check's minutes of work,
    not after them. Collective."""
    data = Path(args.data_dir) if args.data_dir and "epoch" in parts else None
    if data is not None and not data.is_dir():
        raise UserError(f"--data-dir {data} {'is a file, not a folder' if data.exists() else 'does not exist'}: the "
                        f"one-epoch check reads CIFAR-10 from a folder (an unpacked archive, or a folder of "
                        f"train/<class>/ and test/<class>/ images). Point --data-dir at one, or leave it out to "
                        f"skip the epoch.", collective=True)
    cluster.agree(unwritable([("--json", args.json, False)]) if cluster.info.is_main and args.json else None,
                  "the GPU check could not keep its rows")


def check(cluster: Cluster, args: argparse.Namespace) -> int:
    parts = chosen_parts(args)
    check_paths(cluster, args, parts)
    # cuBLAS reads it once, at its first handle: the resume check's --deterministic job comes after other jobs
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    device = place(cluster, args.backend, None).device  # this rank's GPU, current before the bare loop runs on it
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mpi_train-gpu-check-") as folder:
        checks = Checks(cluster=cluster, args=args, folder=Path(folder), device=device, parse=parse_config)
        checks.run_parts(parts)
    if not cluster.info.is_main:
        return 0
    print(table(checks.rows, f"{machine(device, cluster.info.world_size)}, {checks.setting()}")
          + f" in {time.perf_counter() - began:.0f} s", flush=True)
    unwritten = args.json and kept(f"--json {args.json}", lambda: write_json_atomically(args.json, checks.rows))
    return unkept([unwritten], "The GPU check ran") or (0 if all(row["ok"] for row in checks.rows) else 1)


def main(argv: list[str] | None = None) -> int:
    cluster = join_job(argv)
    args = parse_args(argv, quiet=not cluster.info.is_main)
    return guarded(cluster, lambda: check(cluster, args))
