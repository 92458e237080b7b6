"""The model held against a training run step by step: what an overlapped method exposes after backward.

For each step of a run's timeline, the tail is what runs past the end of the last backward to finish. The model's
plan (`predict --calibration`: each bucket's message and how long it lasts) is laid on the step as the ranks ran
it: a bucket's collective leaves once the last rank to launch it has (on the timeline's common clock) and the one
before it has ended, and what runs past that backward's end is the step's predicted tail. Beside it, what the run
measured (each rank's sync end after that backward's end, the job's transfer) and what `predict` gives from the
bench alone (the bench's pooled backward profile and one compute figure). Where the two predictions part, the
difference is the backward the bench saw, not the wire. Last, each collective's time on the wire per step (a message
from the last rank's launch of it, or the end of the rank's message before, to its end) against `predict`'s.

    python scripts/tail_per_step.py TRACE.json --calibration BENCH.json --method zero --link 1gbit \\
        --compute-per-sample 0.0222 [--model vgg11 --batch-size 256 --ranks 4 --ranks-per-host 2]

Figures: docs/results.md ("How well the cost model predicts").
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from mpi_train import netmodel
from mpi_train.analysis.predict import build_parser, meta_model, network_for, registered_methods
from mpi_train.config import model_config
from mpi_train.timeline import wire_per_step

MESSAGE_NAMES = ("reduce-scatter", "allreduce")  # zero's and bucketed's per-bucket messages in a timeline


def predicted_plan(args: argparse.Namespace) -> tuple[list[float], float, float, float, dict]:
    """Each planned message's seconds (launch order), predict's own backward, tail and exposed time, and its
    seconds on the wire per step by collective."""
    network, _ = network_for(args, netmodel.load_calibration(args.calibration))
    model = meta_model(model_config(args))
    params = [p for p in model.parameters() if p.requires_grad]
    tensor_bytes = [p.numel() * p.element_size() for p in params]
    backward = netmodel.load_backward(args.calibration, len(tensor_bytes))
    method = registered_methods(args.bucket_mb, [args.method])[args.method]
    compute_s = args.compute_per_sample * args.batch_size / int(args.ranks)
    backward_s = backward.share * compute_s
    prediction = netmodel.predict(method, tensor_bytes, netmodel.Layout(int(args.ranks), args.ranks_per_host),
                                  network, ratio=netmodel.wire_ratio(method, params),
                                  later=netmodel.later_share(method, params),
                                  backward_s=backward_s, backward=backward, compute_s=compute_s)
    tail = max(0.0, prediction.plan[-1].end_s - backward_s)
    return [m.end_s - m.start_s for m in prediction.plan], backward_s, tail, prediction.exposed_s, prediction.parts


def timed_events(trace: Path) -> list[dict]:
    """A timeline's complete events ("X": phases and messages), each with its start and duration in microseconds."""
    return [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]


def last_launches(messages: list[dict]) -> dict[int, float]:
    """Each bucket's message as the last rank launched it: when its collective could start."""
    launched: dict[int, float] = {}
    for e in messages:
        launched[e["args"]["bucket"]] = max(launched.get(e["args"]["bucket"], e["ts"]), e["ts"])
    return launched


def steps_of(events: list[dict]) -> list[dict]:
    """Per step: the last rank to finish backward, its backward, each bucket's last launch by any rank (seconds from
    that backward's start), each rank's sync end after that backward's end (the job's transfer)."""
    rows = []
    for step in sorted({e["args"]["step"] for e in events if e["name"] == "backward"}):
        of_step = [e for e in events if e.get("args", {}).get("step") == step]
        backward = {e["pid"]: e for e in of_step if e["name"] == "backward"}
        syncs = {e["pid"]: e for e in of_step if e["name"] == "sync"}
        last = max(backward, key=lambda rank: backward[rank]["ts"] + backward[rank]["dur"])
        ends = backward[last]["ts"] + backward[last]["dur"]
        launched = last_launches([e for e in of_step if e["name"] in MESSAGE_NAMES])
        rows.append({"step": step, "rank": last, "backward_s": backward[last]["dur"] / 1e6,
                     "launches_s": [(launched[b] - backward[last]["ts"]) / 1e6 for b in sorted(launched)],
                     "measured_s": statistics.fmean((s["ts"] + s["dur"] - ends) / 1e6 for s in syncs.values())})
    return rows


def main() -> int:
    parser = build_parser()  # predict's own flags, which the plan is made with
    parser.prog, parser.description, parser.epilog = "python scripts/tail_per_step.py", __doc__.split("\n")[0], None
    parser.add_argument("trace", type=Path, help="a training run's timeline (*.trace.json)")
    parser.add_argument("--method", default="zero", help="the run's sync method (default: zero)")
    args = parser.parse_args()
    if not args.calibration or args.compute_per_sample is None:
        parser.error("give --calibration BENCH.json and --compute-per-sample SECONDS, as predict takes them")
    for path in (args.trace, Path(args.calibration)):
        if not path.is_file():
            parser.error(f"{path} is no file: give a training run's timeline (--timeline-steps writes *.trace.json) "
                         f"and the bench JSON its links were calibrated with (bench --json)")
    durations, backward_s, tail_s, exposed_s, parts = predicted_plan(args)
    events = timed_events(args.trace)
    messages = ", ".join(f"{seconds * 1e3:.0f}" for seconds in durations)
    print(f"{args.method}: predict gives {len(durations)} messages of {messages} ms; with the bench's profile, "
          f"backward {backward_s * 1e3:.0f} ms and a tail of {tail_s * 1e3:.0f} ms after it (exposed "
          f"{exposed_s * 1e3:.0f} ms)")
    print(f"{'step':>4} {'last rank':>9} {'backward ms':>11} {'big bucket before end ms':>24} {'tail ms: model':>14} "
          f"{'measured':>8}")
    modelled, measured = [], []
    for row in steps_of(events):
        if len(row["launches_s"]) != len(durations):
            print(f"{row['step']:>4} skipped: {len(row['launches_s'])} messages in the trace, {len(durations)} planned")
            continue
        end = 0.0
        for launch, seconds in zip(row["launches_s"], durations):
            end = max(end, launch) + seconds
        tail = max(0.0, end - row["backward_s"])
        biggest = max(range(len(durations)), key=lambda i: durations[i])
        modelled.append(tail)
        measured.append(row["measured_s"])
        print(f"{row['step']:>4} {row['rank']:>9} {row['backward_s'] * 1e3:>11.0f} "
              f"{(row['backward_s'] - row['launches_s'][biggest]) * 1e3:>24.0f} {tail * 1e3:>14.0f} "
              f"{row['measured_s'] * 1e3:>8.0f}")
    if measured:
        mean_model, mean_measured = statistics.fmean(modelled), statistics.fmean(measured)
        print(f"mean tail: model on each step's last rank {mean_model * 1e3:.0f} ms "
              f"({(mean_model / mean_measured - 1) * 100:+.0f}%), predict from the bench alone {tail_s * 1e3:.0f} ms "
              f"({(tail_s / mean_measured - 1) * 100:+.0f}%), measured {mean_measured * 1e3:.0f} ms")
    for name, seconds in wire_per_step(events).items():
        if name in parts:
            mean = statistics.fmean(seconds)
            print(f"{name} on the wire per step: measured {mean * 1e3:.0f} ms (steps {min(seconds) * 1e3:.0f} to "
                  f"{max(seconds) * 1e3:.0f}), predicted {parts[name] * 1e3:.0f} ms "
                  f"({(parts[name] / mean - 1) * 100:+.0f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
