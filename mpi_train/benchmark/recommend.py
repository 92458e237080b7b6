"""What the advisor makes of its measurements: the step model, the measured steps, the recommendation, and the full
bench's check of the advice."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .. import netmodel
from ..advice import search
from ..advice.search import Candidate, StepModel
from .contenders import NO_SYNC
from .measure import slowest

NOISE_FLOOR = 0.03  # the least share by which a measurement overturns the model's choice


def step_model(per_rank: list[dict], tensor_bytes: Sequence[float], layout: netmodel.Layout,
               network: netmodel.Network, backward: netmodel.Backward,
               units: Sequence[int] | None = None, precision: str = "32-true") -> StepModel:
    """The step without sync as measured (slowest rank per step, median), with the links and backward's profile
    (and each tensor's layer block, `units`: fsdp's messages), at the precision it was timed in."""
    return StepModel(tensor_bytes=tuple(tensor_bytes), layout=layout, network=network, backward=backward,
                     compute_s=statistics.median(slowest(per_rank, NO_SYNC, "compute")),
                     baseline_step_s=statistics.median(slowest(per_rank, NO_SYNC, "step")),
                     units=tuple(units) if units else None, precision=precision)


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
