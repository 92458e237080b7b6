"""The advice's JSON: every candidate predicted and the shortlist measured, the recommendation, the lossy options
and the full bench's check; what `--sync auto` reads back from mlruns/advice/."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from ..advice import cache, memory_limit, search
from ..advice.search import Candidate, StepModel
from ..cluster import Cluster
from ..config import TrainConfig
from ..devices import Placement
from ..optimizers import state_slots
from .contenders import NO_SYNC
from .lossy import configured, lossy_options
from .recommend import bench_noise, full_bench_check, measured_steps, recommendation, step_model
from .shortlist import Searched


def candidate_rows(ranking: list, measured: dict[str, dict], shown: set[str], held: dict[str, float]) -> dict:
    """Per candidate label: its prediction, whether the table shows it, and its measured step where it was timed."""
    rows = {}
    for one in ranking:
        taken = measured.get(one.candidate.label)
        rows[one.candidate.label] = {
            **one.as_dict(), "shown": one.candidate.label in shown,
            "measured_step_s": taken["step_s"] if taken else None,
            "measured_exposed_s": taken["exposed_s"] if taken else None,
            "measured_steps_s": taken["steps_s"] if taken else None,
            "predicted_memory_bytes": held.get(one.candidate.label)}
    return rows


def fitting_lossy(model_name: str, template, model: StepModel, backend: str, world: int, slots: int,
                  limit: int | None) -> tuple[list[dict], list[tuple]]:
    """The lossy options predicted to fit the memory limit, and those refused (the backend's, then the limit's)."""
    lossy, refused = lossy_options(model_name, [p for p in template.parameters() if p.requires_grad], model, backend)
    held = memory_limit.held_per_rank({row["label"]: configured(row["label"]) for row in lossy}, template, world,
                                      slots)
    refused += [(row["label"], why) for row in lossy if (why := memory_limit.over(row["label"], held, limit))]
    return [row for row in lossy if not memory_limit.over(row["label"], held, limit)], refused


def advice_result(args: argparse.Namespace, *, cluster: Cluster, placement: Placement, precision: str,
                  settings: TrainConfig, template, links: dict, searched: Searched, profiled: StepModel,
                  chosen: Sequence[Candidate], per_rank: list[dict], advised_s: float, full: tuple | None) -> dict:
    """Rank 0: the advice, its step model made of the short bench's no-sync steps and the profile's backward."""
    world, layout, backward = cluster.info.world_size, profiled.layout, profiled.backward
    model = step_model(per_rank, profiled.tensor_bytes, layout, profiled.network, backward, profiled.units,
                       precision)
    ranking = search.ranked(list(dict.fromkeys([*searched.found, *chosen])), model)
    measured = measured_steps(per_rank)
    shown = {one.candidate.label for one in search.best_of_each(ranking)} | {c.label for c in chosen}
    rows = candidate_rows(ranking, measured, shown, searched.held)
    timed = [rows[c.label] for c in chosen]
    noise = bench_noise(measured[NO_SYNC]["steps_s"])
    tau = search.kendall_tau([row["predicted_step_s"] for row in timed], [row["measured_step_s"] for row in timed])
    optimizer = settings.optimizer_settings
    lossy, lossy_refused = fitting_lossy(args.model, template, model, placement.backend, world,
                                         state_slots(optimizer), searched.limit)
    created = time.time()
    bucketed = sorted({one.candidate.sync for one in ranking if one.candidate.bucket_mb is not None})
    sizes = sorted({one.candidate.bucket_mb for one in ranking if one.candidate.bucket_mb is not None})
    result = {
        "kind": cache.KIND, "version": cache.VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_s": created, "hosts": list(cluster.hosts), "world_size": world, "model": args.model,
        "batch_size": args.batch_size, "backend": placement.backend, "threads": placement.threads, "link": args.link,
        "precision": precision, "precision_flag": args.precision,
        "layout": {"hosts": layout.hosts, "ranks_per_host": layout.ranks_per_host},
        "gradient_bytes": int(sum(profiled.tensor_bytes)), "tensors": len(profiled.tensor_bytes),
        "calibration": {**links, "backward": backward.as_dict()},
        "calibration_age_s": created - links["measured_at_s"],
        "compute_s": model.compute_s, "baseline_step_s": model.baseline_step_s, "backward_share": backward.share,
        "search": {"configurations": len(searched.found), "methods": searched.methods, "bucket_tuned": bucketed,
                   "bucket_sizes_mb": sizes},
        "bench": {"steps": args.steps, "warmup": args.warmup, "no_sync_steps_s": measured[NO_SYNC]["steps_s"]},
        "measured": [c.label for c in chosen], "kendall_tau": tau,
        "candidates": list(rows.values()),
        "bench_noise": noise,
        # (the shortlist's first is the model's choice)
        "recommended": recommendation(rows, chosen[0].label, model, noise),
        "lossy": lossy, "unavailable": searched.unavailable, "lossy_unavailable": lossy_refused,
        "advise_s": advised_s, "memory_limit_bytes": searched.limit, "momentum": optimizer.momentum,
        "optimizer": optimizer.optimizer, "over_memory_limit": searched.over_limit,
    }
    if full is not None:
        result["full_bench"] = full_bench_check(*full, model, result["recommended"]["label"], args.full_bench)
    return result
