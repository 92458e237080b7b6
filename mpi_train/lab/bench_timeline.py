"""`python -m mpi_train bench-timeline`: what the sync split and the timeline measure, and what they cost.

Runs one short job on this machine several ways and prints, side by side:
- the split's arithmetic: on every logged step, wait + transfer against the measured sync time;
- a trace's messages: on every rank and recorded step, the messages inside the sync phase plus the
  wait against the sync phase;
- a straggler (MPI_TRAIN_SLOW=LAST_RANK:0.3): the other ranks' wait rise and their transfer against
  the same job without it;
- a DDP job's trace: how much of its message time ran under compute, against the run's own comm_overlap;
- the cost: step time with --timeline against without (alternating which runs first), and the
  recorder's own time as a share of step time, for the always-on split and for a timeline.

    python -m mpi_train bench-timeline --np 4 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from ..config import TrainConfig
from ..errors import ArgumentParser
from ..failpoints import SLOW_ENV
from ..sync import BASELINE
from . import mpirun

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
STRAGGLER_S = 0.3


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m mpi_train bench-timeline", description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=4, help="ranks per job (default: 4)")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per job (default: 40)")
    parser.add_argument("--repeats", type=int, default=2, help="pairs of jobs without and with --timeline (default: 2)")
    parser.add_argument("--sync", default=TrainConfig.sync, help="the method of the split, straggler and cost "
                                                                   f"jobs (default: {TrainConfig.sync})")
    parser.add_argument("--train-args", default="--dataset synthetic --synthetic-size 4096 --batch-size 64",
                        help="further arguments of every job (default: %(default)s)")
    return parser


def run_job(args, folder: Path, name: str, *flags: str, env: dict | None = None) -> dict:
    """One job's summary; its trace, if it recorded one, under folder/timelines/."""
    summary = folder / f"{name}.json"
    command = ["mpirun", "-np", str(args.np), "--oversubscribe", sys.executable, "-m", "mpi_train",
               *args.train_args.split(), "--max-steps", str(args.steps), "--log-every", "1", "--timing-warmup-steps",
               "2", "--no-tracking", "--run-name", name, "--summary-json", str(summary), *flags]
    result = mpirun.run(command, env={**os.environ, **mpirun.OPEN_MPI_ENV, "PYTHONPATH": str(PACKAGE_ROOT),
                                      **(env or {})}, cwd=folder)
    if result.returncode:
        raise SystemExit(f"bench_timeline: job {name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return json.loads(summary.read_text())


def split_arithmetic(summary: dict) -> float:
    """The largest |wait + transfer - sync| / sync over the logged steps (means over ranks)."""
    return max(abs(s["sync_wait_s"] + s["sync_transfer_s"] - s["sync_time_s"]) / s["sync_time_s"]
               for s in summary["steps"] if s["sync_time_s"] > 0)


def trace_accounts(path: Path) -> list[float]:
    """Per rank and recorded step: (the wait for the last rank + message time after it, inside the sync phase) /
    the sync phase - 1, from the trace alone (times on rank 0's clock). A blocking collective's first message
    starts with the wait, so only message time after the last arrival counts as transfer."""
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    syncs = {(e["pid"], e["args"]["step"]): (e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "sync"}
    last = defaultdict(float)
    for (rank, step), (start, _) in syncs.items():
        last[step] = max(last[step], start)
    sent = defaultdict(float)
    for e in events:
        key = (e["pid"], e["args"]["step"])
        if e["cat"] == "message" and key in syncs:
            start, end = max(syncs[key][0], last[key[1]]), syncs[key][1]
            sent[key] += max(0.0, min(end, e["ts"] + e["dur"]) - max(start, e["ts"]))
    errors = []
    for (rank, step), (start, end) in syncs.items():
        if end > start:
            wait = min(last[step] - start, end - start)
            errors.append((wait + sent[rank, step]) / (end - start) - 1)
    return errors


def overlap_share(path: Path) -> float:
    """The share of a trace's message time that ran before its rank's last gradient was ready (HTA's overlap:
    communication under compute), from the trace's own gradient and message events."""
    document = json.loads(path.read_text())["traceEvents"]
    computed = defaultdict(float)
    for e in document:
        if e.get("cat") == "gradient":
            key = (e["pid"], e["args"]["step"])
            computed[key] = max(computed[key], e["ts"])
    total = during = 0.0
    for e in document:
        if e.get("cat") == "message" and (e["pid"], e["args"]["step"]) in computed:
            total += e["dur"]
            during += max(0.0, min(computed[e["pid"], e["args"]["step"]], e["ts"] + e["dur"]) - e["ts"])
    return during / total if total else 0.0


def trace_of(summary: dict, folder: Path) -> Path:
    """The job's trace; its summary names it relative to where the job ran."""
    return folder / summary["timeline"]["trace"]


def others_mean(summary: dict, key: str, ranks: int) -> float:
    """The mean of a split figure over the first `ranks` ranks (all but the straggler)."""
    return statistics.fmean(rank[key] for rank in summary["sync_split_after_warmup"]["per_rank"][:ranks])


def steady_step(summary: dict) -> float:
    return summary["mean_times_after_warmup"]["step_time_s"]


def recorder_share(summary: dict) -> float:
    return statistics.fmean(summary["recorder_busy_s"]) / (summary["mean_times"]["step_time_s"]
                                                          * summary["total_steps"])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench_timeline_"))
    sync = ["--sync", args.sync]
    try:
        plain, recorded = [], []
        for repeat in range(args.repeats):
            for timeline in ((False, True) if repeat % 2 == 0 else (True, False)):  # alternate which goes first
                if timeline:
                    recorded.append(run_job(args, folder, f"timeline-{repeat}", *sync, "--timeline"))
                else:
                    plain.append(run_job(args, folder, f"plain-{repeat}", *sync))
            print(f"pair {repeat + 1}: step {1000 * steady_step(plain[-1]):.2f} ms without a timeline, "
                  f"{1000 * steady_step(recorded[-1]):.2f} ms with", flush=True)
        slowest = args.np - 1
        slow = run_job(args, folder, "straggler", *sync, env={SLOW_ENV: f"{slowest}:{STRAGGLER_S}"})
        ddp = run_job(args, folder, "ddp-timeline", "--sync", BASELINE, "--timeline")

        print(f"\n{args.np} ranks, {args.steps} steps, {args.sync} ({args.train_args}); steady state after 2 steps")
        worst = max(split_arithmetic(s) for s in plain + recorded)
        print(f"split arithmetic: |wait + transfer - sync| / sync at most {100 * worst:.3f}% over every logged step "
              f"(target 2%)")
        errors = [e for s in recorded for e in trace_accounts(trace_of(s, folder))]
        within = sum(abs(e) <= 0.05 for e in errors)
        print(f"trace: wait + messages after the last arrival against the sync phase, {len(errors)} rank-steps: "
              f"median {100 * statistics.median(errors):+.2f}%, worst {100 * max(errors, key=abs):+.2f}%, "
              f"{within} within 5% (target 5%)")
        wait = others_mean(slow, "sync_wait_s", slowest)
        rise = wait - statistics.fmean(others_mean(s, "sync_wait_s", slowest) for s in plain)
        transfer = others_mean(slow, "sync_transfer_s", slowest)
        transfer_base = statistics.fmean(others_mean(s, "sync_transfer_s", slowest) for s in plain)
        print(f"straggler (rank {slowest} +{STRAGGLER_S} s per step): the other ranks' wait {1000 * wait:.1f} ms, "
              f"a rise of {1000 * rise:.1f} ms ({100 * (rise / STRAGGLER_S - 1):+.1f}% of {STRAGGLER_S} s, target "
              f"+-15%); their transfer {1000 * transfer:.2f} ms against {1000 * transfer_base:.2f} ms without it "
              f"({100 * (transfer / transfer_base - 1):+.1f}%, target +-15%); slowest rank named: "
              f"{slow['sync_split_after_warmup']['slowest_rank']}")
        print(f"ddp: {100 * overlap_share(trace_of(ddp, folder)):.0f}% of its message time ran before the last "
              f"gradient was ready (from the trace; the run's own comm_overlap over every step: "
              f"{100 * ddp['sync_split_after_warmup']['mean']['comm_overlap']:.0f}%), exposed communication "
              f"{1000 * ddp['sync_split_after_warmup']['mean']['exposed_comm_s']:.1f} ms per step")
        off, on = statistics.fmean(map(steady_step, plain)), statistics.fmean(map(steady_step, recorded))
        print(f"cost of --timeline: step {1000 * off:.2f} ms without, {1000 * on:.2f} ms with, ratio {on / off:.4f} "
              f"(noise of a shared machine included; target at most 1.02); the recorder's own time "
              f"{100 * statistics.fmean(map(recorder_share, recorded)):.3f}% of step time")
        print(f"cost of the always-on split: the recorder's own time "
              f"{100 * statistics.fmean(map(recorder_share, plain)):.3f}% of step time (target 0.5%)")
        alignment = [rank["error_s"] for s in plain + recorded for rank in s["clock_alignment"]]
        print(f"clock alignment on one machine: error bound at most {1000 * max(alignment):.3f} ms")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0
