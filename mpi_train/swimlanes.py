"""A timeline as a picture: ranks as rows, each step's phases and messages as bars, beside the model's messages.

Under each rank's measured messages a lane shows what the alpha-beta model (netmodel/) expects of the
same step's messages, started from when that step's gradients were really ready: where the two lanes
part is where the model's link, latency or CPU picture is wrong, bucket by bucket.
"""

from __future__ import annotations

import statistics
import textwrap
from pathlib import Path

from .files import write_figure
from .netmodel import Backward, message_plan

PHASE_COLOURS = {"data": "#c7c7c7", "forward": "#9ecae1", "backward": "#3182bd", "sync": "#e6550d",
                 "optimizer": "#31a354", "average": "#e6550d"}  # a model average is a sync too
SHOWN_STEPS = 2


def predicted(step, model, method) -> dict | None:
    """The model's messages for one kept step (timeline.Step): seconds from the start of its backward, with each
    gradient ready when it was measured to be. None when the step kept no backward boundary."""
    backward_start, sync_start = step.bounds[2:4]
    backward_s = sync_start - backward_start
    if backward_s <= 0 or not step.gradients:
        return None
    first = {}
    for index, at in step.gradients:
        first.setdefault(index, at)
    count = len(model.tensor_bytes)
    ready = tuple(min(1.0, max(0.0, (first.get(i, sync_start) - backward_start) / backward_s)) for i in range(count))
    order = tuple(sorted(first, key=first.get)) if len(first) == count else None
    plan = message_plan(method, model.tensor_bytes, model.layout, model.network, model.ratio, backward_s,
                        Backward(ready=ready, order=order), later=model.later)
    return {"step": step.step, "backward_s": backward_s,
            "messages": [{"start_s": m.start_s, "end_s": m.end_s, "bytes": m.nbytes} for m in plan]}


def bucket_rows(steps, plan: dict | None) -> list[dict]:
    """Per message index of a step (a bucket, a tensor or the one buffer): its measured duration and end after
    backward (medians over rank 0's kept steps) beside the model's, for the lab report."""
    measured: dict[int, list[tuple[float, float]]] = {}
    for step in steps:
        backward_end = step.bounds[3]
        ordered = sorted((m for m in step.messages if m.kind == "message" and m.end is not None),
                         key=lambda m: m.start)
        for index, message in enumerate(ordered):
            measured.setdefault(index, []).append((message.end - message.start, message.end - backward_end))
    predicted_messages = plan["messages"] if plan else []
    rows = []
    for index, values in sorted(measured.items()):
        row = {"message": index, "measured_s": statistics.median(v[0] for v in values),
               "measured_end_after_backward_s": statistics.median(v[1] for v in values)}
        if index < len(predicted_messages):
            model = predicted_messages[index]
            row.update(predicted_s=model["end_s"] - model["start_s"],
                       predicted_end_after_backward_s=model["end_s"] - plan["backward_s"])
        rows.append(row)
    return rows


def draw(document: dict, path: Path, plan: dict | None = None) -> Path:
    """Swimlanes of the first steps of a Chrome-trace document (timeline.trace): a row per rank with its phases,
    its messages, and the model's messages (`plan`, predicted()) beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = [e for e in document["traceEvents"] if e.get("ph") == "X"]
    steps = sorted({e["args"]["step"] for e in events if e.get("cat") == "phase"})[:SHOWN_STEPS]
    shown = [e for e in events if e["args"].get("step") in steps]
    ranks = sorted({e["pid"] for e in shown})
    origin = min((e["ts"] for e in shown), default=0.0)

    def ms(ts: float) -> float:
        return (ts - origin) / 1000

    fig, ax = plt.subplots(figsize=(14, 1.2 + 1.1 * len(ranks)))
    for row, rank in enumerate(ranks):
        top = -row * 3.0
        for event in (e for e in shown if e["pid"] == rank):
            start, width = ms(event["ts"]), event["dur"] / 1000
            if event["cat"] == "phase":
                ax.broken_barh([(start, width)], (top, 0.9), color=PHASE_COLOURS.get(event["name"], "grey"))
            elif event["cat"] == "message":
                ax.broken_barh([(start, width)], (top - 1.0, 0.8), color="#756bb1", edgecolor="white", linewidth=0.5)
            elif event["cat"] == "background":  # an overlapped average, under the steps that follow its sending
                ax.broken_barh([(start, width)], (top - 1.0, 0.8), color="#bcbddc", edgecolor="#756bb1", linewidth=0.5)
            else:  # a compressor's own work
                ax.broken_barh([(start, width)], (top - 1.0, 0.8), color="#fdae6b")
        if plan:  # the model's messages of the same step, from this rank's backward start
            backward = next((e for e in shown if e["pid"] == rank and e["name"] == "backward"
                             and e["args"]["step"] == plan["step"]), None)
            if backward is not None:
                bars = [(ms(backward["ts"]) + m["start_s"] * 1000, (m["end_s"] - m["start_s"]) * 1000)
                        for m in plan["messages"]]
                ax.broken_barh(bars, (top - 1.9, 0.8), facecolor="none", edgecolor="#756bb1", hatch="///")
    ax.set_yticks([-row * 3.0 + offset for row in range(len(ranks)) for offset in (0.45, -0.6, -1.5)],
                  [label for rank in ranks for label in (f"rank {rank}", "messages", "model")], fontsize=8)
    ax.set_xlabel("ms (rank 0's clock)")
    about = document.get("otherData", {})
    ax.set_title(f"{about.get('run', '')}: steps {', '.join(map(str, steps))}, {about.get('sync', '')}"
                 + (f"+{about['compression']}" if about.get("compression", "none") != "none" else "")
                 + ("\n" + textwrap.fill(f"compiled: {about['overlap_lost_to_compile']}", 110)
                    if about.get("overlap_lost_to_compile") else ""))
    handles = [Patch(color=colour, label=name) for name, colour in PHASE_COLOURS.items()]
    handles += [Patch(color="#756bb1", label="message (measured)"), Patch(color="#fdae6b", label="compressor"),
                Patch(color="#bcbddc", label="message in the background"),
                Patch(facecolor="none", edgecolor="#756bb1", hatch="///", label="message (model)")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=8, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return write_figure(fig, path, bbox_inches="tight")  # the legend sits under the axes
