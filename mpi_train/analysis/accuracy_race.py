"""The race to accuracy in a comparison: which target the runs race to, and their times carried to other links."""

from __future__ import annotations

import math

from ..errors import UserError
from ..models import BUILT_IN, TOKENS
from ..sync import GRADIENTS, SYNC_METHODS, split_label
from . import time_to_accuracy
from .finished_jobs import FinishedJob, timing
from .time_to_accuracy import Evaluation, Target


def workload_groups(jobs: list[FinishedJob]) -> list[tuple[str, list[FinishedJob]]]:
    """The jobs by workload, in the order each first appears: a race to accuracy is run within one, as MNIST's test
    accuracy and a GPT's next-byte accuracy are no race."""
    groups: dict[str, list[FinishedJob]] = {}
    for job in jobs:
        groups.setdefault(job.workload, []).append(job)
    return list(groups.items())


def accuracy_runs(jobs: list[FinishedJob]) -> list[tuple[str, str, list[Evaluation]]]:
    return [(job.name, job.sync, job.evaluations) for job in jobs if job.evaluations]


def configuration(job: FinishedJob) -> tuple:
    """What decides a run's steps to accuracy, whatever its link: every lossless method computes the same update (one
    key for all of them); another is its label with its averaging period, at its world size and global batch."""
    name, compression = split_label(job.sync)
    method = SYNC_METHODS.get(name)
    lossless = (method is not None and method.traits.averages == GRADIENTS and compression == "none"
                and not method.traits.fixed_compression)
    options = () if lossless else (job.sync, *(job.params.get(key) for key in ("period", "host_period",
                                                                              "powersgd_rank")))
    return ("lossless" if lossless else "", *options, job.world_size, job.params.get("batch_size"))


def carried_to_links(jobs: list[FinishedJob], target: float | Target) -> list[dict]:
    """Time to `target` on every link a configuration's runs were timed on (time_to_accuracy.carried); [] unless
    some run is carried to a link other than its evaluated run's."""
    evaluated = [(configuration(job), job.evaluations) for job in jobs if job.evaluations]
    timed = [(configuration(job), {"run": job.name, "sync": job.sync, "link": job.params.get("link") or "-",
                                   "step_s": timing(job.metrics, "step_time_s")}) for job in jobs]
    rows = time_to_accuracy.carried(evaluated, timed, target)
    reached_on = {job.params.get("link") or "-" for job in jobs
                  if job.evaluations and time_to_accuracy.reached(job.evaluations, target)}
    return rows if any(row["link"] not in reached_on for row in rows) else []


def language_models(jobs: list[FinishedJob]) -> bool:
    """Every job trained a language model (gpt): the race is to a validation loss, not an accuracy."""
    def takes_tokens(name: str | None) -> bool:
        return name in BUILT_IN and BUILT_IN[name].takes == TOKENS  # a user's own model takes images

    return bool(jobs) and all(takes_tokens(job.params.get("model")) for job in jobs)


def race_target(jobs: list[FinishedJob], target_accuracy: float | None = None,
                target_loss: float | None = None) -> Target | None:
    """What time to accuracy is measured to: the validation loss or accuracy given (not both), else for language
    models the best final validation loss plus 0.05 nats, for the others the best final accuracy minus 2 points;
    None when no run was evaluated."""
    if target_accuracy is not None and target_loss is not None:
        raise UserError(f"a comparison races to one target, and both a target accuracy ({target_accuracy}) and a "
                        f"target loss ({target_loss}) are given. Keep the accuracy for image models, the "
                        f"validation loss for language models.")
    if target_loss is not None:
        if not 0 < target_loss < math.inf:
            raise UserError(f"--target-loss {target_loss:g} is no validation loss to race to: give a positive one, "
                            f"e.g. 2.0 nats per byte for gpt.")
        return Target(target_loss, time_to_accuracy.LOSS)
    if target_accuracy is not None:
        if not 0 < target_accuracy <= 1:
            hint = f" (did you mean {target_accuracy / 100:g}?)" if 1 < target_accuracy <= 100 else ""
            raise UserError(f"--target-accuracy {target_accuracy:g} is not a fraction in (0, 1]{hint}: give the "
                            f"accuracy to race to as a fraction, e.g. 0.6 for 60%.")
        return Target(target_accuracy)
    kind = time_to_accuracy.LOSS if language_models(jobs) else time_to_accuracy.ACCURACY
    value = time_to_accuracy.default_target([c for _, _, c in accuracy_runs(jobs)], kind=kind)
    return Target(value, kind) if value is not None else None
