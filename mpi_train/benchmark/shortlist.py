"""Which lossless configurations the advisor measures: every one that fits the memory limit, predicted from the
profile of the model without sync, and the fastest few kept."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .. import netmodel
from ..advice import memory_limit, search
from ..advice.search import Candidate, StepModel
from ..cluster import Cluster
from ..lr_schedule import OptimizerDefaults
from ..optimizers import state_slots
from .measure import pooled_backward
from .recommend import step_model


@dataclass(frozen=True)
class Searched:
    """The lossless configurations the advisor searched: those that fit the memory limit, each one's predicted bytes
    per rank, and what it left out (with why)."""

    found: list[Candidate]
    methods: list[str]
    unavailable: list
    over_limit: list
    held: dict[str, float]
    limit: int | None


def searched(backend: str, template: nn.Module, order: tuple[int, ...] | None, world: int,
             optimizer: OptimizerDefaults, limit_text: str | None) -> Searched:
    """Every lossless configuration the backend runs (bucketed at each bucket size that cuts the gradients
    differently, in the order backward made them), less those over --memory-limit."""
    usable, refused = search.lossless(backend)
    found = search.candidates(usable, netmodel.tensor_sizes(template), order)
    limit = memory_limit.parse_size(limit_text)
    found, over_limit, held = memory_limit.fitting(found, template, world, state_slots(optimizer), limit)
    return Searched(found=found, methods=usable, unavailable=refused, over_limit=over_limit, held=held, limit=limit)


def profiled_model(profile: list[dict], order: tuple[int, ...] | None, links: dict, template: nn.Module,
                   hosts: tuple[str, ...], precision: str) -> StepModel:
    """Rank 0: the step model of the profile (timed at `precision`), with backward's timing pooled over every rank's
    steps, as the bench's."""
    backward = pooled_backward(profile, order)
    network = netmodel.Network.from_dict(links["network"])
    layout = netmodel.Layout.of_hosts(list(hosts))
    return step_model(profile, netmodel.tensor_sizes(template), layout, network, backward,
                      netmodel.tensor_units(template), precision)


def shortlist(cluster: Cluster, candidates: Searched, profiled: StepModel | None, count: int) -> list[Candidate]:
    """The `count` configurations rank 0 predicts fastest (each method at its best bucket size, and ddp as the
    reference); every rank gets them. Collective."""
    chosen = None
    if profiled is not None:
        chosen = [one.as_dict() for one in search.shortlist(search.ranked(candidates.found, profiled), count)]
    return [Candidate.from_dict(one) for one in cluster.bcast(chosen)]
