"""`python -m mpi_train gpu-check`: what a GPU machine must show before its figures are trusted, in one table.

    python -m mpi_train gpu-check --data-dir data                       # one GPU, one rank
    mpirun -np 8 python -m mpi_train gpu-check --data-dir data          # a rank per GPU

Every sync method with every compression it carries trains a few steps under NCCL; `--sync ddp`'s steady step is
timed against a bare PyTorch loop (pytorch/examples' shape: the batch already on the GPU, forward, backward, SGD
step) in the same process; a job checkpointed part-way resumes to the same weights bit for bit (--deterministic);
and, with --data-dir, one real CIFAR-10 epoch trains on the resident data path, its training time held against
steps x the bare step and its accuracy against the CPU's 63% +- 3 points. Rank 0 prints the table; the exit status
is 1 when a check fails. On CPUs (`--backend gloo`) it dry-runs its own code with whatever model is named.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..cluster import Cluster
from ..config import DATASET_SHAPES, TrainConfig, add_model_arguments, model_config, model_flag_words
from ..data import synthetic_batch
from ..errors import UserError
from ..optimizers import OPTIMIZERS
from ..rankguard import RankAwareParser, guarded, join_job
from ..sync import BASELINE, COMPRESSORS, SYNC_METHODS, backend_error, combination_error, label
from ..train import run
from .train import parse_config

STEP_TARGET = 1.10  # --sync ddp's step against the bare loop's
EPOCH_TARGET = 1.5  # one epoch's training time against steps x the bare step
CPU_ACCURACY, ACCURACY_BAND = 0.63, 0.03  # one CIFAR-10 epoch of VGG-11, as measured on CPUs (docs/results.md)


# The overlapped averages (sync/background.py), each with several periods so that averages are in flight
OVERLAPPED = {"localsgd --overlap": "--sync localsgd --period 2 --overlap",
              "localsgd+fp16 --overlap --fragments 2": "--sync localsgd --compression fp16 --period 4 --overlap "
                                                       "--fragments 2",
              "diloco --overlap": "--sync diloco --period 2 --overlap"}
OVERLAP_STEPS = 8


def held(summary: dict) -> str:
    """`; held 105.5 MiB, CUDA peak 812.0 MiB`: what the method costs in memory beside its speed."""
    most = summary.get("memory", {}).get("most", {})
    if not most:
        return ""
    peak = f", CUDA peak {most['cuda_peak_bytes'] / 2**20:,.1f} MiB" if "cuda_peak_bytes" in most else ""
    return f"; held {most['total_bytes'] / 2**20:,.1f} MiB{peak}"


def parse_args(argv: list[str] | None, quiet: bool = False) -> argparse.Namespace:
    parser = RankAwareParser(prog="python -m mpi_train gpu-check", description=__doc__.split("\n\n")[0], quiet=quiet)
    parser.add_argument("--data-dir", help="CIFAR-10 for the one-epoch check (left out without it)")
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"), help="nccl (default); gloo dry-runs "
                        "the check on CPUs")
    add_model_arguments(parser, dataset=False)  # every job trains synthetic data shaped for it (CIFAR-10's epoch aside)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch (default: 256)")
    parser.add_argument("--steps", type=int, default=6, help="steps of each method's short job (default: 6)")
    parser.add_argument("--timed-steps", type=int, default=60, help="steps the bare loop and ddp are timed over "
                        "(default: 60, after 10 untimed)")
    parser.add_argument("--methods", help="comma-separated --sync names (default: all)")
    parser.add_argument("--json", help="also write the table's rows here (rank 0)")
    return parser.parse_args(argv)


def combinations(backend: str, names: list[str]) -> list[tuple[str, str]]:
    """Every (method, compression) the registry allows that runs on `backend`."""
    return [(name, compression) for name in names if not backend_error(name, backend)
            for compression in COMPRESSORS if not combination_error(name, compression)
            and (compression == "none" or not SYNC_METHODS[name].fixed_compression)]


def bare_step(workload: TrainConfig, batch: int, device: torch.device, wrap=None):
    """The plainest loop's step: the batch on the device, forward, backward, the job's optimizer (the model's
    default: SGD for the convnets, AdamW for gpt), no host wait; `wrap(model)`, if given, wraps the model first."""
    torch.manual_seed(0)
    model = workload.make_model().to(device)
    net = wrap(model) if wrap else model
    settings = workload.optimizer_settings
    optimizer = OPTIMIZERS[settings.optimizer].build(model.parameters(), settings)
    images, labels = (part.to(device) for part in synthetic_batch(workload, batch))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(net(images), labels).backward()
        optimizer.step()
    return step


def seconds_per_step(step, device: torch.device, warm: int, timed: int, wait_each: bool = False) -> float:
    """`step()` timed over `timed` calls after `warm`, free-running (or waiting for the GPU after each)."""
    cuda = device.type == "cuda"
    for _ in range(warm):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    for _ in range(timed):
        step()
        if wait_each and cuda:
            torch.cuda.synchronize(device)
    if cuda:
        torch.cuda.synchronize(device)
    return (time.perf_counter() - began) / timed


class Checks:
    """The rows of the table, as the jobs give them."""

    def __init__(self, cluster: Cluster, args: argparse.Namespace, folder: Path):
        self.cluster, self.args, self.folder = cluster, args, folder
        self.workload = model_config(args)  # refused here, on every rank, as training would refuse it
        if args.data_dir and self.workload.input_shape != DATASET_SHAPES["cifar10"]:
            raise UserError(f"--data-dir adds one CIFAR-10 epoch, which --model {args.model} cannot train (it takes "
                            f"{self.workload.input_shape}). Drop --data-dir, or check an image model that takes "
                            f"3x32x32 images.")
        self.common = ["--backend", args.backend, *model_flag_words(args), "--batch-size", str(args.batch_size),
                       "--no-tracking", "--log-every", "1000"]
        self.rows: list[dict] = []

    def job(self, name: str, *flags: str) -> dict:
        """Train `flags` on every rank; rank 0's summary (empty elsewhere)."""
        out = self.folder / f"{name}.json"
        config = parse_config([*self.common, *flags, "--summary-json", str(out)], quiet=True)
        gc.collect()  # what of the job before can go (cycles through hooks) goes before this job's peak counts
        run(config, self.cluster)
        return json.loads(out.read_text()) if self.cluster.info.is_main else {}

    def row(self, check: str, ok: bool, figure: str) -> None:
        self.rows.append({"check": check, "ok": ok, "figure": figure})

    def trained(self, check: str, name: str, *flags: str) -> dict | None:
        """A short job's summary on rank 0 ({} elsewhere); None, with a failed row, where the job broke: one method
        that fails on this machine is a row of the table, not the end of the check."""
        try:
            return self.job(name, *flags)
        except Exception as error:  # noqa: BLE001 - reported in the table, with its kind and first line
            self.row(check, False, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:160])
            return None

    def methods(self) -> None:
        names = [name.strip() for name in self.args.methods.split(",")] if self.args.methods else list(SYNC_METHODS)
        unknown = [name for name in names if name not in SYNC_METHODS]
        if unknown:
            raise UserError(f"--methods names {', '.join(unknown)}, which is no sync method; choose among "
                            f"{', '.join(SYNC_METHODS)}.")
        synthetic = ["--dataset", "synthetic", "--synthetic-size", str(4 * self.args.batch_size)]
        for sync, compression in combinations(self.args.backend, names):
            check = f"{label(sync, compression)}: {self.args.steps} steps"
            summary = self.trained(check, label(sync, compression), *synthetic, "--sync", sync, "--compression",
                                   compression, "--max-steps", str(self.args.steps))
            if summary and self.cluster.info.is_main:
                loss = summary["final_loss"]
                step = summary["mean_times_after_warmup"]["step_time_s"]
                self.row(check, math.isfinite(loss) and loss < 10,
                         f"loss {loss:.3f}, step {step * 1e3:.1f} ms{held(summary)}")

    def overlapped(self) -> None:
        """The averages sent while the next period computes (--overlap): on CUDA a side stream, not Gloo's thread."""
        synthetic = ["--dataset", "synthetic", "--synthetic-size", str(4 * self.args.batch_size)]
        for name, flags in OVERLAPPED.items():
            check = f"{name}: {OVERLAP_STEPS} steps"
            summary = self.trained(check, name.replace(" ", "_"), *synthetic, *flags.split(), "--max-steps",
                                   str(OVERLAP_STEPS))
            if summary and self.cluster.info.is_main:
                loss = summary["final_loss"]
                step = summary["mean_times_after_warmup"]["step_time_s"]
                self.row(check, math.isfinite(loss) and loss < 10,
                         f"loss {loss:.3f}, step {step * 1e3:.1f} ms")

    def step_against_bare(self, device: torch.device) -> float:
        warm, timed = 10, self.args.timed_steps
        bare = seconds_per_step(bare_step(self.workload, self.args.batch_size // self.cluster.info.world_size, device),
                                device, warm, timed)
        # one epoch holds every step, as the bare loop's are: no test evaluation, nor the GPU idle after it, midway
        summary = self.job("ddp-timed", "--dataset", "synthetic",
                           "--synthetic-size", str((warm + timed) * self.args.batch_size),
                           "--sync", BASELINE, "--max-steps", str(warm + timed), "--timing-warmup-steps", str(warm))
        if self.cluster.info.is_main:
            means = summary["mean_times_after_warmup"]
            ratio = means["step_time_s"] / bare
            speed = summary.get("throughput", {})
            self.row(f"{BASELINE} step / bare loop step (target <= {STEP_TARGET}x)", ratio <= STEP_TARGET,
                     f"{means['step_time_s'] * 1e3:.2f} / {bare * 1e3:.2f} ms = {ratio:.2f}x; data "
                     f"{means['data_time_s'] * 1e3:.2f} ms"
                     + (f"; MFU {100 * speed['mfu']:.1f}%" if "mfu" in speed else ""))
        return bare

    def resume(self) -> None:
        common = ["--dataset", "synthetic", "--synthetic-size", str(4 * self.args.batch_size), "--sync", BASELINE,
                  "--deterministic", "--epochs", "2"]
        whole = self.job("resume-whole", *common, "--max-steps", "6")
        checkpoints = self.folder / "checkpoints"
        self.job("resume-first", *common, "--max-steps", "3", "--checkpoint-dir", str(checkpoints))
        resumed = self.job("resume-second", *common, "--max-steps", "6", "--resume", str(checkpoints))
        if self.cluster.info.is_main:
            same = whole["weights_sha256"] == resumed["weights_sha256"]
            self.row("checkpoint at step 3 resumed to step 6, --deterministic", same,
                     "weights equal bit for bit" if same else "weights differ")

    def epoch(self, bare_s: float) -> None:
        summary = self.job("cifar10-epoch", "--data-dir", self.args.data_dir, "--sync", BASELINE, "--epochs", "1")
        if not self.cluster.info.is_main:
            return
        steps = summary["total_steps"]
        trained_s = summary["evaluations"][-1]["elapsed_s"]
        accuracy = summary["epochs"][-1]["test_accuracy"]
        ratio = trained_s / (steps * bare_s)
        self.row(f"CIFAR-10 epoch training time / (steps x bare step) (target <= {EPOCH_TARGET}x)",
                 ratio <= EPOCH_TARGET, f"{trained_s:.2f} s / ({steps} x {bare_s * 1e3:.2f} ms) = {ratio:.2f}x; "
                                        f"data {summary['data_path']}")
        self.row(f"CIFAR-10 epoch test accuracy (CPU: {CPU_ACCURACY:.0%} +- {ACCURACY_BAND * 100:.0f} points)",
                 abs(accuracy - CPU_ACCURACY) <= ACCURACY_BAND, f"{100 * accuracy:.2f}%")


def table(rows: list[dict], device: str) -> str:
    width = max(len(row["check"]) for row in rows)
    lines = [f"GPU check on {device}:", f"  {'check':<{width}}  {'':4}  figure"]
    lines += [f"  {row['check']:<{width}}  {'ok' if row['ok'] else 'FAIL':4}  {row['figure']}" for row in rows]
    failed = sum(not row["ok"] for row in rows)
    lines.append(f"{len(rows) - failed} passed, {failed} failed")
    return "\n".join(lines)


def check(cluster: Cluster, args: argparse.Namespace) -> int:
    if args.backend == "nccl" and not torch.cuda.is_available():
        raise UserError("the GPU check runs under NCCL and this machine has no CUDA device torch can use. Run it on "
                        "a GPU machine, or dry-run its code on CPUs with --backend gloo.", collective=True)
    # cuBLAS reads it once, at its first handle: the resume check's --deterministic job comes after other jobs
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mpi_train-gpu-check-") as folder:
        checks = Checks(cluster, args, Path(folder))
        checks.methods()  # the first job made this rank's GPU current, and cuDNN autotuning
        if not args.methods or "localsgd" in args.methods or "diloco" in args.methods:
            checks.overlapped()
        device = torch.device("cuda", torch.cuda.current_device()) if args.backend == "nccl" else torch.device("cpu")
        bare = checks.step_against_bare(device)
        checks.resume()
        if args.data_dir:
            checks.epoch(bare)
    if not cluster.info.is_main:
        return 0
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(table(checks.rows, f"{name} x {cluster.info.world_size}, torch {torch.__version__}"
                             + (f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}" if device.type == "cuda"
                                else "")) + f" in {time.perf_counter() - began:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(checks.rows, indent=2) + "\n")
    return 0 if all(row["ok"] for row in checks.rows) else 1


def main(argv: list[str] | None = None) -> int:
    cluster = join_job(argv)
    args = parse_args(argv, quiet=not cluster.info.is_main)
    return guarded(cluster, lambda: check(cluster, args))
