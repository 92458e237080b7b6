"""The GPU check's measuring: the bare loop and its timing, the short jobs each part trains, and the table their rows
make (commands/gpu_check.py parses its flags and prints the table)."""

from __future__ import annotations

import argparse
import gc
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..cluster import Cluster
from ..config import DATASET_SHAPES, TrainConfig, model_config, model_flag_words
from ..data import synthetic_batch
from ..errors import UserError
from ..optimizers import OPTIMIZERS
from ..step.compiling import COMPILE_MODES, wants_channels_last
from ..step.precision import PRECISIONS, agreed
from ..sync import BASELINE, COMPRESSORS, SYNC_METHODS, backend_error, combination_error, label
from ..train import run

STEP_TARGET = 1.10  # --sync ddp's step against the bare loop's
EPOCH_TARGET = 1.5  # one epoch's training time against steps x the bare step
SPEEDUP_TARGET = 2.0  # samples/s under --precision and --compile against 32-true eager (VGG-11 on an H100 or H200)
CHANNELS_LAST_MARGIN = 0.03  # the job's memory format may be this much slower than the other: the noise of two runs
CPU_ACCURACY, ACCURACY_BAND = 0.63, 0.03  # one CIFAR-10 epoch of VGG-11, as measured on CPUs (docs/results.md)
REFERENCE = "32-true"  # what the speed-up is held against, run eagerly
FLOAT16 = "16-mixed"
FLOAT16_METHODS = "ddp,zero,fsdp,localsgd"
# what the check runs, in this order (the targets first, so that a run cut short by a time limit has shown them):
# step: ddp against the bare loop and the speed-up over 32-true eager; epoch: CIFAR-10's (with --data-dir);
# channels_last: a compiled conv net's bare loop with it and without; methods: every method and compression; float16:
# --float16-methods in 16-mixed, and a resume in it; overlap: the overlapped averages; resume: a resume in --precision
PARTS = ("step", "epoch", "channels_last", "methods", "float16", "overlap", "resume")
WARM_STEPS = 10  # untimed steps before the bare loop's and ddp's timed ones (the first compiles a compiled bare loop)


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


def combinations(backend: str, names: list[str]) -> list[tuple[str, str]]:
    """Every (method, compression) the registry allows that runs on `backend`."""
    return [(name, compression) for name in names if not backend_error(name, backend)
            for compression in COMPRESSORS if not combination_error(name, compression)
            and (compression == "none" or not SYNC_METHODS[name].traits.fixed_compression)]


def method_names(text: str | None, flag: str) -> list[str]:
    """A comma-separated list of --sync names (None: every method); a UserError names those that are none."""
    names = [name.strip() for name in text.split(",") if name.strip()] if text is not None else list(SYNC_METHODS)
    unknown = [name for name in names if name not in SYNC_METHODS]
    if unknown:
        raise UserError(f"{flag} names {', '.join(unknown)}, which is no sync method; choose among "
                        f"{', '.join(SYNC_METHODS)}.")
    return names


def bare_step(workload: TrainConfig, batch: int, device: torch.device, wrap=None, precision: str = REFERENCE,
              compile_mode: str | None = None, channels_last: bool = False):
    """The plainest loop's step: the batch on the device, forward (under autocast to `precision`'s dtype, its loss
    scaled under 16-mixed), backward, the job's optimizer (the model's default: SGD for the convnets, AdamW for
    gpt), no host wait; `wrap(model)`, if given, wraps the model first; `compile_mode`: the model compiled as
    --compile compiles it; `channels_last`: its weights in NHWC."""
    torch.manual_seed(0)
    model = workload.make_model().to(device)
    images, labels = (part.to(device) for part in synthetic_batch(workload, batch))
    if channels_last:  # the weights, as a compiled job lays them out (the batch comes as the data path gives it)
        model = model.to(memory_format=torch.channels_last)
    net = wrap(model) if wrap else model
    if compile_mode:
        torch._dynamo.reset()  # graphs of an earlier model go, as a compiled job's do at its start
        model.compile(mode=compile_mode, dynamic=False)
    settings = workload.optimizer_settings
    optimizer = OPTIMIZERS[settings.optimizer].build(model.parameters(), settings)
    computing = PRECISIONS[precision]
    scaler = torch.amp.GradScaler(device.type) if computing.scaled else None

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with computing.autocast(device):
            loss = F.cross_entropy(net(images), labels)
        if scaler is None:
            loss.backward()
            optimizer.step()
            return
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
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


def rate(summary: dict) -> tuple[float, str]:
    """A job's steady samples/s per rank, or tokens/s for a language model, with its unit."""
    speed = summary.get("throughput", {})
    if "tokens_per_s_per_rank" in speed:
        return speed["tokens_per_s_per_rank"], "tokens/s"
    return speed.get("samples_per_s_per_rank", 0.0), "samples/s"


def mfu(summary: dict) -> str:
    """`, MFU 41.2% of the bf16 peak` where the device's peak is known."""
    speed = summary.get("throughput", {})
    return f", MFU {100 * speed['mfu']:.1f}% of the {speed['dtype']} peak" if "mfu" in speed else ""


def convolves(model: nn.Module) -> bool:
    return any(isinstance(module, nn.Conv2d) for module in model.modules())


class Checks:
    """The rows of the table, as the jobs give them."""

    def __init__(self, *, cluster: Cluster, args: argparse.Namespace, folder: Path, device: torch.device,
                 parse: Callable[..., TrainConfig]):
        """`parse`: the training command's flags to a TrainConfig (commands/train.py's parse_config), passed in by
        the command: this library sits below the commands."""
        self.cluster, self.args, self.folder, self.device, self.parse = cluster, args, folder, device, parse
        self.workload = model_config(args)  # refused here, on every rank, as training would refuse it
        if args.data_dir and self.workload.input_shape != DATASET_SHAPES["cifar10"]:
            raise UserError(f"--data-dir adds one CIFAR-10 epoch, which --model {args.model} cannot train (it takes "
                            f"{self.workload.input_shape}). Drop --data-dir, or check an image model that takes "
                            f"3x32x32 images.")
        self.precision = agreed(args.precision, device, cluster).name  # the bare loop's, as the jobs resolve it
        self.common = ["--backend", args.backend, *model_flag_words(args), "--batch-size", str(args.batch_size),
                       "--precision", self.precision, "--no-tracking", "--log-every", "1000"]
        self.compiled = ["--compile", "--compile-mode", args.compile_mode] if args.compile else []
        self.synthetic = ["--dataset", "synthetic", "--synthetic-size", str(4 * args.batch_size)]
        self.rows: list[dict] = []

    @property
    def per_rank(self) -> int:
        return self.args.batch_size // self.cluster.info.world_size

    def setting(self, precision: str | None = None, compiled: bool | None = None) -> str:
        """`bf16-mixed + compile`: how a job or the bare loop computes."""
        compiled = self.args.compile if compiled is None else compiled
        mode = f" ({self.args.compile_mode})" if self.args.compile_mode != COMPILE_MODES[0] else ""
        return (precision or self.precision) + (f" + compile{mode}" if compiled else " eager")

    def job(self, name: str, *flags: str) -> dict:
        """Train `flags` on every rank; rank 0's summary (empty elsewhere)."""
        out = self.folder / f"{name}.json"
        config = self.parse([*self.common, *flags, "--summary-json", str(out)], quiet=True)
        gc.collect()  # what of the job before can go (cycles through hooks) goes before this job's peak counts
        run(config, self.cluster)
        return json.loads(out.read_text()) if self.cluster.info.is_main else {}

    def row(self, check: str, ok: bool, figure: str) -> None:
        """A row of the table, printed as it comes too: a stage cut short by its time limit still shows it."""
        self.rows.append({"check": check, "ok": ok, "figure": figure})
        if self.cluster.info.is_main:
            print(f"gpu-check: {'ok' if ok else 'FAIL'}  {check}: {figure}", flush=True)

    def trained(self, check: str, name: str, *flags: str) -> dict | None:
        """A short job's summary on rank 0 ({} elsewhere); None, with a failed row, where the job broke: one method
        that fails on this machine is a row of the table, not the end of the check."""
        try:
            return self.job(name, *flags)
        except Exception as error:  # noqa: BLE001 - reported in the table, with its kind and first line
            self.row(check, False, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:160])
            return None

    def short_jobs(self, pairs: list[tuple[str, str]], precision: str) -> None:
        """A few steps of each (method, compression) under `precision`: its loss, step and memory."""
        for sync, compression in pairs:
            check = f"{label(sync, compression)} {precision}: {self.args.steps} steps"
            summary = self.trained(check, f"{label(sync, compression)}-{precision}", *self.synthetic,
                                   "--precision", precision, "--sync", sync, "--compression", compression,
                                   "--max-steps", str(self.args.steps))
            if summary and self.cluster.info.is_main:
                loss = summary["final_loss"]
                step = summary["mean_times_after_warmup"]["step_time_s"]
                self.row(check, math.isfinite(loss) and loss < 10,
                         f"loss {loss:.3f}, step {step * 1e3:.1f} ms{held(summary)}")

    def methods(self) -> None:
        self.short_jobs(combinations(self.args.backend, method_names(self.args.methods, "--methods")), self.precision)

    def float16(self) -> None:
        """The methods of --float16-methods under 16-mixed (its loss scale, a step whose gradients overflow skipped),
        uncompressed, and a resume under it."""
        names = [name for name in method_names(self.args.float16_methods, "--float16-methods")
                 if not backend_error(name, self.args.backend)]
        if not names or self.precision == FLOAT16:
            return
        self.short_jobs([(name, "none") for name in names], FLOAT16)
        self.resume(FLOAT16)

    def overlapped(self) -> None:
        """The averages sent while the next period computes (--overlap): on CUDA a side stream, not Gloo's thread."""
        for name, flags in OVERLAPPED.items():
            check = f"{name}: {OVERLAP_STEPS} steps"
            summary = self.trained(check, name.replace(" ", "_"), *self.synthetic, *flags.split(), "--max-steps",
                                   str(OVERLAP_STEPS))
            if summary and self.cluster.info.is_main:
                loss = summary["final_loss"]
                step = summary["mean_times_after_warmup"]["step_time_s"]
                self.row(check, math.isfinite(loss) and loss < 10,
                         f"loss {loss:.3f}, step {step * 1e3:.1f} ms")

    def bare(self, compiled: bool, channels_last: bool | None = None) -> float:
        """Seconds per step of the bare loop under the check's precision, compiled or not; its weights channels_last
        as a compiled job's would be unless `channels_last` says."""
        if channels_last is None:
            with torch.device("meta"):
                channels_last = compiled and wants_channels_last(self.workload.make_model(), self.device)
        step = bare_step(self.workload, self.per_rank, self.device, precision=self.precision,
                         compile_mode=self.args.compile_mode if compiled else None, channels_last=channels_last)
        return seconds_per_step(step, self.device, WARM_STEPS, self.args.timed_steps)

    def timed(self, name: str, *flags: str) -> dict:
        """`--sync ddp` over one epoch of warm-up plus timed steps, the warm-up left out of its means: no test
        evaluation, nor the GPU idle after it, midway."""
        return self.job(name, "--dataset", "synthetic",
                        "--synthetic-size", str((WARM_STEPS + self.args.timed_steps) * self.args.batch_size),
                        "--sync", BASELINE, "--max-steps", str(WARM_STEPS + self.args.timed_steps),
                        "--timing-warmup-steps", str(WARM_STEPS), *flags)

    def step_against_bare(self) -> float:
        """ddp's step against the bare loop's, both under the check's precision and compile; the bare step."""
        bare = self.bare(self.args.compile)
        summary = self.timed("ddp-timed", *self.compiled)
        if self.cluster.info.is_main:
            means = summary["mean_times_after_warmup"]
            ratio = means["step_time_s"] / bare
            speed, unit = rate(summary)
            compile_s = summary.get("compile_s")
            self.row(f"{BASELINE} step / bare loop step, {self.setting()} (target <= {STEP_TARGET}x)",
                     ratio <= STEP_TARGET,
                     f"{means['step_time_s'] * 1e3:.2f} / {bare * 1e3:.2f} ms = {ratio:.2f}x; data "
                     f"{means['data_time_s'] * 1e3:.2f} ms; {speed:,.0f} {unit}/rank{mfu(summary)}"
                     + (f"; compiled in {compile_s:.1f} s" if isinstance(compile_s, (int, float)) else ""))
        self.speedup(summary)
        return bare

    def speedup(self, summary: dict) -> None:
        """The job's samples/s under the check's precision and compile against 32-true eager, the same job."""
        if self.precision == REFERENCE and not self.args.compile:
            return
        reference = self.timed("ddp-timed-reference", "--precision", REFERENCE)
        if self.cluster.info.is_main:
            (fast, unit), (slow, _) = rate(summary), rate(reference)
            ratio = fast / slow if slow else 0.0
            self.row(f"{unit}, {self.setting()} / {self.setting(REFERENCE, False)} (target >= "
                     f"{self.args.speedup_target:g}x)", ratio >= self.args.speedup_target,
                     f"{fast:,.0f} / {slow:,.0f} = {ratio:.2f}x{mfu(summary)}"
                     + (f"; {REFERENCE}{mfu(reference)}" if mfu(reference) else ""))

    def channels_last(self, bare_s: float | None) -> None:
        """A compiled conv net's bare step with its weights channels_last and without: the format a compiled job
        picks (step/compiling.py) must be the faster, within the noise of two runs. `bare_s`: the step in the
        format the job picks, if timed already."""
        with torch.device("meta"):
            model = self.workload.make_model()
        if not self.args.compile or not convolves(model):
            return
        picked = wants_channels_last(model, self.device)
        bare_s = bare_s or self.bare(True, channels_last=picked)
        other = self.bare(True, channels_last=not picked)
        on, off = (bare_s, other) if picked else (other, bare_s)
        self.row(f"bare loop channels_last on / off, {self.setting()} (the job runs it "
                 f"{'on' if picked else 'off'}: the faster)", min(bare_s, other) * (1 + CHANNELS_LAST_MARGIN) >= bare_s,
                 f"{on * 1e3:.2f} / {off * 1e3:.2f} ms = {on / off:.2f}x")

    def resume(self, precision: str) -> None:
        common = [*self.synthetic, "--sync", BASELINE, "--deterministic", "--epochs", "2", "--precision", precision]
        whole = self.job(f"resume-whole-{precision}", *common, "--max-steps", "6")
        checkpoints = self.folder / f"checkpoints-{precision}"
        self.job(f"resume-first-{precision}", *common, "--max-steps", "3", "--checkpoint-dir", str(checkpoints))
        resumed = self.job(f"resume-second-{precision}", *common, "--max-steps", "6", "--resume", str(checkpoints))
        if self.cluster.info.is_main:
            same = whole["weights_sha256"] == resumed["weights_sha256"]
            self.row(f"{precision}: checkpoint at step 3 resumed to step 6, --deterministic", same,
                     "weights equal bit for bit" if same else "weights differ")

    def epoch(self, bare_s: float) -> None:
        """One real CIFAR-10 epoch under the check's precision, eagerly (a compile would add a graph for its last,
        smaller batch and for scoring): its training time against steps x the eager bare step."""
        limit = ["--max-steps", str(self.args.epoch_steps)] if self.args.epoch_steps else []
        summary = self.job("cifar10-epoch", "--data-dir", self.args.data_dir, "--sync", BASELINE, "--epochs", "1",
                           *limit)
        if not self.cluster.info.is_main:
            return
        steps = summary["total_steps"]
        trained_s = summary["evaluations"][-1]["elapsed_s"]
        accuracy = summary["evaluations"][-1]["test_accuracy"]
        ratio = trained_s / (steps * bare_s)
        self.row(f"CIFAR-10 epoch, {self.setting(compiled=False)}: training time / (steps x bare step) (target <= "
                 f"{EPOCH_TARGET}x)", ratio <= EPOCH_TARGET,
                 f"{trained_s:.2f} s / ({steps} x {bare_s * 1e3:.2f} ms) = {ratio:.2f}x; data {summary['data_path']}")
        self.row(f"CIFAR-10 epoch, {self.setting(compiled=False)}: test accuracy (CPU: {CPU_ACCURACY:.0%} +- "
                 f"{ACCURACY_BAND * 100:.0f} points)", abs(accuracy - CPU_ACCURACY) <= ACCURACY_BAND,
                 f"{100 * accuracy:.2f}%" + (f" after {steps} steps" if self.args.epoch_steps else ""))

    def run_parts(self, parts: Sequence[str]) -> None:
        """The parts asked, always in PARTS' order: the targets first, so that a run cut short has shown them."""
        args = self.args
        bare = self.step_against_bare() if "step" in parts else None
        if "epoch" in parts and args.data_dir:
            self.epoch(self.bare(False) if args.compile or bare is None else bare)
        if "channels_last" in parts:
            self.channels_last(bare)
        if "methods" in parts:
            self.methods()
        if "float16" in parts:
            self.float16()
        if "overlap" in parts and (not args.methods or "localsgd" in args.methods or "diloco" in args.methods):
            self.overlapped()
        if "resume" in parts:
            self.resume(self.precision)


def machine(device: torch.device, world_size: int) -> str:
    """`NVIDIA H100 80GB HBM3 x 8, torch 2.x, NCCL 2.x`: what the table's figures were measured on."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    nccl = f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}" if device.type == "cuda" else ""
    return f"{name} x {world_size}, torch {torch.__version__}{nccl}"


def table(rows: list[dict], device: str) -> str:
    """The rows under one header, and how many passed: what rank 0 prints at the end."""
    width = max((len(row["check"]) for row in rows), default=5)
    lines = [f"GPU check on {device}:", f"  {'check':<{width}}  {'':4}  figure"]
    lines += [f"  {row['check']:<{width}}  {'ok' if row['ok'] else 'FAIL':4}  {row['figure']}" for row in rows]
    failed = sum(not row["ok"] for row in rows)
    lines.append(f"{len(rows) - failed} passed, {failed} failed")
    return "\n".join(lines)
