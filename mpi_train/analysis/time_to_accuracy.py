"""Time to accuracy: how many steps, seconds and megabytes each run took to first reach a target test accuracy (or,
for a language model, a target validation loss).

A method twice as fast per step that needs three times the steps is no faster: the fair measure is the time to a
target accuracy (DAWNBench's). For the same math it splits into steps to accuracy (the method's, the same on any
network) times step time (the network's, which the bench and the alpha-beta model give), so a run's steps to
accuracy can be carried to a network it did not run on (`python -m mpi_train predict --steps-to-accuracy`).

Runs are scored at each test evaluation (--eval-every N, and every epoch's end), each logged with the job's wall
time spent training (evaluations left out) and the megabytes rank 0 had sent; a run reaches the target at its first
evaluation at or above it. The default target is the best run's final accuracy minus 2 points.

A language model's accuracy (of the next byte) says little; what it is trained to lower is its validation loss, in
nats per byte. Its target is a loss, reached at the first evaluation at or below it; by default the best run's final
validation loss plus 0.05 nats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..files import write_figure
from ..outputs.text_table import text_table
from ..sync import BASELINE

DEFAULT_MARGIN = 0.02  # the default target: the best final accuracy minus 2 points
DEFAULT_LOSS_MARGIN = 0.05  # a language model's: the best final validation loss plus 0.05 nats per byte
ACCURACY, LOSS = "accuracy", "loss"  # what a target is: a test accuracy to reach or a validation loss to get below
COLUMNS = ("run", "sync", "target", "steps", "time_s", "sent_MB", "final", "time_vs")


@dataclass(frozen=True)
class Evaluation:
    """One test evaluation of a run: its step, accuracy, and the wall time and bytes it took to get there."""

    step: int
    accuracy: float
    elapsed_s: float | None
    sent_mb: float | None
    loss: float | None = None  # its test loss (a language model's validation loss, nats per byte)


@dataclass(frozen=True)
class Target:
    """What the runs race to: a test accuracy at or above `value`, or a validation loss at or below it."""

    value: float
    kind: str = ACCURACY

    def score(self, evaluation: Evaluation) -> float | None:
        return evaluation.accuracy if self.kind == ACCURACY else evaluation.loss

    def met(self, evaluation: Evaluation) -> bool:
        score = self.score(evaluation)
        return score is not None and (score >= self.value if self.kind == ACCURACY else score <= self.value)

    def show(self, value: float | None = None) -> str:
        """`value` (default: the target's) as this kind of figure: 60.00% or 1.850 nats/byte."""
        value = self.value if value is None else value
        return f"{100 * value:.2f}%" if self.kind == ACCURACY else f"{value:.3f}"

    @property
    def what(self) -> str:
        return "accuracy" if self.kind == ACCURACY else "validation loss"


def as_target(target: float | Target) -> Target:
    """A plain number is a test accuracy, as it was before language models."""
    return target if isinstance(target, Target) else Target(target)


def reached(evaluations: Sequence[Evaluation], target: float | Target) -> Evaluation | None:
    """The first evaluation that meets `target` (at or above an accuracy, at or below a loss), or None if the run
    never got there."""
    target = as_target(target)
    return next((e for e in sorted(evaluations, key=lambda e: e.step) if target.met(e)), None)


def default_target(curves: Sequence[Sequence[Evaluation]], margin: float | None = None,
                   kind: str = ACCURACY) -> float | None:
    """The best run's final accuracy minus `margin` (default 2 points), or for `kind` LOSS its lowest final
    validation loss plus `margin` (default 0.05 nats); None when no run was evaluated."""
    if kind == LOSS:
        finals = [max(curve, key=lambda e: e.step).loss for curve in curves if curve]
        finals = [loss for loss in finals if loss is not None]
        return min(finals) + (DEFAULT_LOSS_MARGIN if margin is None else margin) if finals else None
    finals = [max(curve, key=lambda e: e.step).accuracy for curve in curves if curve]
    return max(finals) - (DEFAULT_MARGIN if margin is None else margin) if finals else None


def rows(runs: Sequence[tuple[str, str, Sequence[Evaluation]]], target: float | Target,
         reference: str | None = None) -> list:
    """Per run (name, method label, evaluations): steps, seconds and megabytes to `target`, its final accuracy (or
    validation loss), and its time against the `reference` method's (default: ddp's, else the slowest run's to reach
    it)."""
    target = as_target(target)
    table = []
    for name, sync, curve in runs:
        hit = reached(curve, target)
        final = target.score(max(curve, key=lambda e: e.step)) if curve else None
        table.append({"run": name, "sync": sync, "target": target.value, "kind": target.kind,
                      "steps": hit.step if hit else None, "time_s": hit.elapsed_s if hit else None,
                      "sent_mb": hit.sent_mb if hit else None,
                      "final_accuracy": final})
    timed = [row for row in table if row["time_s"] is not None]
    by_reference = [row for row in timed if row["sync"] == (reference or BASELINE)]
    base = by_reference[0] if by_reference else max(timed, key=lambda row: row["time_s"], default=None)
    for row in table:
        row["reference"] = base["sync"] if base else None
        known = base and row["time_s"] is not None and base["time_s"]
        row["time_vs"] = row["time_s"] / base["time_s"] if known else None
    return table


def format_rows(table: list[dict]) -> str:
    def cell(row: dict, column: str) -> str:
        target = Target(row["target"], row.get("kind", ACCURACY))
        value = {"target": target.value, "sent_MB": row["sent_mb"], "final": row["final_accuracy"],
                 "time_vs": row["time_vs"]}.get(column, row.get(column))
        if value is None:
            return "not reached" if column == "steps" else "-"
        if column in ("target", "final"):
            return target.show(value)
        if column == "time_vs":
            return f"{value:.2f}x"
        if isinstance(value, float):
            return f"{value:,.1f}"
        return str(value)

    cells = [list(COLUMNS)] + [[cell(row, c) for c in COLUMNS] for row in table]
    return text_table(cells)


def describe(table: list[dict], given: bool) -> str:
    """The section's text: the target and where it came from, then the table."""
    target = Target(table[0]["target"], table[0].get("kind", ACCURACY))
    reference = table[0]["reference"]
    if target.kind == LOSS:
        source = "as given" if given else f"the best final validation loss plus {DEFAULT_LOSS_MARGIN:g} nats"
        return (f"Time to validation loss: steps, training time (evaluations left out) and megabytes rank 0 sent "
                f"until the first evaluation at or below {target.show()} nats (a mean cross-entropy: per byte for gpt, "
                f"per sample for an image model) ({source}); final = the last "
                f"validation loss; time_vs = time against {reference or 'the reference'}'s:\n" + format_rows(table))
    source = ("as given" if given
              else f"the best final accuracy minus {100 * DEFAULT_MARGIN:.0f} points")
    return (f"Time to accuracy: steps, training time (evaluations left out) and megabytes rank 0 sent until the first "
            f"test evaluation at or above {target.show()} ({source}); final = the last test accuracy; time_vs = time "
            f"against {reference or 'the reference'}'s:\n" + format_rows(table))


def plot(runs: Sequence[tuple[str, str, Sequence[Evaluation]]], target: float | Target, path) -> object:
    """Accuracy (or validation loss) against training time and against megabytes sent, one line per run, the target
    drawn across."""
    target = as_target(target)
    scale = 100 if target.kind == ACCURACY else 1

    def score(e: Evaluation) -> float | None:
        value = target.score(e)
        return None if value is None else scale * value

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_bytes) = plt.subplots(1, 2, figsize=(12, 5))
    for name, sync, curve in runs:
        points = sorted(curve, key=lambda e: e.step)
        if any(e.elapsed_s is not None for e in points):
            by_time.plot([e.elapsed_s for e in points], [score(e) for e in points], marker="o", markersize=3,
                         label=name)
        if any(e.sent_mb is not None for e in points):
            by_bytes.plot([e.sent_mb for e in points], [score(e) for e in points], marker="o", markersize=3,
                          label=name)
    for ax, xlabel in ((by_time, "training time (s), evaluations left out"), (by_bytes, "MB sent by rank 0")):
        ax.axhline(scale * target.value, color="grey", linestyle="--", linewidth=1, label=f"target {target.show()}")
        ax.set(xlabel=xlabel, ylabel="test accuracy (%)" if target.kind == ACCURACY else "validation loss (nats/byte)")
        ax.grid(alpha=0.3)
    by_bytes.set_xscale("symlog")
    by_time.set_title(f"{target.what.capitalize()} against wall time")
    by_bytes.set_title(f"{target.what.capitalize()} against bytes sent")
    by_time.legend(fontsize=7)
    return write_figure(fig, path)


def carried(evaluated: Sequence[tuple[tuple, Sequence[Evaluation]]], timed: Sequence[tuple[tuple, dict]],
            target: float | Target) -> list[dict]:
    """Steps to `target` of each configuration that was evaluated, times the step of each run of the same
    configuration (on whatever link it ran): `evaluated` holds (configuration, evaluations), `timed` (configuration,
    {"run", "sync", "link", "step_s"}). One row per timed run whose configuration reached the target."""
    steps = {}
    for key, curve in evaluated:
        hit = reached(curve, target)
        if hit is not None:
            steps.setdefault(key, hit.step)
    return [{**run, "steps": steps[key], "time_s": steps[key] * run["step_s"]}
            for key, run in timed if key in steps and run.get("step_s")]


def describe_carried(table: list[dict], target: float | Target) -> str:
    """The carried rows by link, fastest first, each with its time against ddp's on the same link."""
    target = as_target(target)
    lines = [(f"Time to {target.what} {target.show()} on each link measured: steps to it (the evaluated runs', the "
              f"same for every lossless method) x the mean step of a run on that link; time_vs = against ddp's on that "
              f"link:"),
             f"{'link':<10}{'sync':<24}{'steps':>6}{'step_s':>9}{'time_s':>10}{'time_vs':>9}  run"]
    for link in sorted({row["link"] for row in table}):
        rows = sorted((row for row in table if row["link"] == link), key=lambda row: row["time_s"])
        ddp = next((row for row in rows if row["sync"] == BASELINE), None)
        for row in rows:
            versus = f"{row['time_s'] / ddp['time_s']:.2f}x" if ddp else "-"
            lines.append(f"{link:<10}{row['sync']:<24}{row['steps']:>6}{row['step_s']:>9.3f}{row['time_s']:>10.1f}"
                         f"{versus:>9}  {row['run']}")
    return "\n".join(lines)
