"""A sweep's launches in order: each run's and each bench's mpirun command line, log and expected steps."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path

from ..config import TrainConfig, redact_uri
from .experiment_file import BenchPlan, PlannedRun, Sweep
from .network import NetworkSetting
from .sweep_launch import Launch
from .testhosts import TestHosts

DATASET_SIZES = {"cifar10": 50_000, "mnist": 60_000}  # training images, to estimate steps before a run starts


def mpirun_prefix(sweep: Sweep, np: int, setting: NetworkSetting | None = None) -> list[str]:
    """mpirun with the hostfile and Open MPI's settings for this machine, as the README's launch line has them."""
    command = ["mpirun", "-np", str(np)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")  # Open MPI refuses root (containers) without it
    hostfile = str(lab_hostfile(sweep, setting)) if setting and setting.hosts > 1 else sweep.hostfile
    if hostfile:
        command += ["--hostfile", hostfile]
    return command + list(sweep.mpirun_args)


def lab_folder(sweep: Sweep) -> Path:
    """Where the test hosts' hostfiles and state go."""
    return sweep.out / "network"


def lab_hostfile(sweep: Sweep, setting: NetworkSetting) -> Path:
    return lab_folder(sweep) / f"hostfile-{setting.hosts}x{setting.ranks_per_host}"  # written by TestHosts.hostfile


def bench_json(sweep: Sweep, setting: NetworkSetting | None) -> Path:
    """Where the bench writes its results: one file per network setting."""
    return sweep.out / (f"bench-{setting.label}.json" if setting else "bench.json")


def train_flags(config: TrainConfig) -> list[str]:
    """The options of `python -m mpi_train` that differ from its defaults (sync and seed always)."""
    defaults = TrainConfig()
    flags = []
    for item in dataclasses.fields(TrainConfig):
        value = getattr(config, item.name)
        if value == getattr(defaults, item.name) and item.name not in ("sync", "seed"):
            continue
        flag = "--" + item.name.replace("_", "-")
        if isinstance(value, bool):
            flags += [flag] if value else []
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def run_command(sweep: Sweep, run: PlannedRun, uri: str | None, summary: Path) -> list[str]:
    """A training run's command: its options, and where it files its summary, its MLflow run and its checkpoints
    (`checkpoint_dir`/<run name>, where the file names a checkpoint_dir)."""
    tracking = {"experiment": sweep.name, "tracking_uri": uri} if uri else {"no_tracking": True}
    timelines = {"timeline_dir": str(sweep.out / "timelines")} if run.config.timeline_window else {}
    # each run its own checkpoints: in one folder, a run would start among another's and --resume auto continue them
    folder = run.config.checkpoint_dir
    checkpoints = {"checkpoint_dir": str(Path(folder) / run.name)} if folder else {}
    config = dataclasses.replace(run.config, summary_json=str(summary), run_name=run.name, **timelines, **tracking,
                                 **checkpoints)
    return [*mpirun_prefix(sweep, run.np, run.network), sys.executable, "-m", "mpi_train", *train_flags(config)]


def bench_command(sweep: Sweep, bench: BenchPlan, uri: str | None, json_path: Path,
                  setting: NetworkSetting | None = None) -> list[str]:
    """The bench's command at its world size, or on a network setting with that setting's link."""
    np = setting.slots if setting else bench.np
    command = [*mpirun_prefix(sweep, np, setting), sys.executable, "-m", "mpi_train", "bench", "--model", bench.model,
               "--batch-size", str(bench.batch_size), "--steps", str(bench.steps), "--warmup", str(bench.warmup),
               "--json", str(json_path)] + (["--link", setting.link] if setting else [])
    if bench.gpt_size:
        command += ["--gpt-size", bench.gpt_size]
    if bench.methods:
        command += ["--methods", ",".join(bench.methods)]
    if uri:
        name = f"bench-{sweep.name}" + (f"-{setting.label}" if setting else "")
        return command + ["--experiment", sweep.name, "--tracking-uri", uri, "--run-name", name]
    return command + ["--no-tracking"]


def estimated_steps(run: PlannedRun) -> int:
    """Steps the run will take, known before it starts (it prints the exact number when it does): for a data set of
    unknown size (text, an image folder, the user's own) its --max-steps, else 0 until it prints them."""
    config = run.config
    size = config.synthetic_samples if config.dataset == "synthetic" else DATASET_SIZES.get(config.dataset)
    if size is None:
        return config.max_steps or 0
    per_rank = config.batch_size // run.np
    steps_per_epoch = math.ceil(math.ceil(size / run.np) / per_rank)  # DistributedSampler pads each shard
    total = config.epochs * steps_per_epoch
    return min(total, config.max_steps) if config.max_steps else total


def plan(sweep: Sweep, uri: str | None) -> list[Launch]:
    """Every run in file order, then the bench; with [network], grouped by setting."""
    if sweep.network:
        return plan_network(sweep, uri)
    out = sweep.out
    launches = [Launch(index=run.index, name=run.name,
                       command=run_command(sweep, run, uri, out / "runs" / f"{run.name}.json"),
                       steps=estimated_steps(run), log=out / "logs" / f"{run.index:02d}-{run.name}.log", env=run.env)
                for run in sweep.runs]
    if sweep.bench:
        b, index = sweep.bench, len(launches) + 1
        launches.append(Launch(index=index, name=f"bench-np{b.np}",
                               command=bench_command(sweep, b, uri, out / "bench.json"), steps=b.steps + b.warmup,
                               log=out / "logs" / f"{index:02d}-bench.log"))
    return launches


def plan_network(sweep: Sweep, uri: str | None) -> list[Launch]:
    """Per network setting: its bench first (the runs' calibration), then its runs; settings in [network] order."""
    out, launches = sweep.out, []
    for setting in sweep.network.settings:
        env = TestHosts.launch_env(setting)
        calibration = None
        if sweep.bench and setting in sweep.bench.settings:
            b, index = sweep.bench, len(launches) + 1
            calibration = bench_json(sweep, setting)
            launches.append(Launch(index=index, name=f"bench-np{setting.slots}-{setting.label}",
                                   command=bench_command(sweep, b, uri, calibration, setting),
                                   steps=b.steps + b.warmup,
                                   log=out / "logs" / f"{index:02d}-bench-{setting.label}.log", env=env,
                                   network=setting))
        for run in (r for r in sweep.runs if r.network == setting):
            index = len(launches) + 1
            launches.append(Launch(index=index, name=run.name,
                                   command=run_command(sweep, run, uri, out / "runs" / f"{run.name}.json"),
                                   steps=estimated_steps(run), log=out / "logs" / f"{index:02d}-{run.name}.log",
                                   env={**env, **run.env}, network=setting, calibration=calibration))
    return launches


def describe_plan(sweep: Sweep, launches: list[Launch], uri: str | None) -> str:
    """What --dry-run prints: the sweep, what "all" left out, and each launch with its command."""
    lines = [(f"{sweep.path}: experiment {sweep.name!r}, {len(launches)} run(s), tracking "
              f"{redact_uri(uri) if uri else 'off'}, output in {sweep.out}/")]
    if sweep.description:
        lines.append(f"  {sweep.description}")
    for method, why in sweep.unavailable:
        lines.append(f"unavailable, not launched: {method}: {why}")
    for launch in launches:
        env = "".join(f"{k}={v} " for k, v in launch.env.items())
        lines.append(f"[{launch.index}/{len(launches)}] {launch.name} (~{launch.steps} steps)\n"
                     f"    {env}{' '.join(launch.command)}")
    return "\n".join(lines)
