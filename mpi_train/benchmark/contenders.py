"""The replicas a benchmark times side by side: a no-sync baseline and each sync method, each on its own copy of
the model (a method may hook into its model's backward)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
from torch import nn

from .. import netmodel
from ..config import TrainConfig
from ..sync import SyncMethod, backend_error, build_method, parse_labels, split_label
from ..sync.compression.powersgd import DEFAULT_RANK

NO_SYNC = "no-sync"  # the baseline: backward only; every method's exposed communication is measured against it


class NoSync(SyncMethod):
    """Leaves the gradients as they are: the step a method would take if communication were free."""

    def sync(self, model: nn.Module) -> None:
        pass


@dataclass(frozen=True)
class Contender:
    """One timed replica: its label, its method, its own model and what the method wrapped it in."""

    name: str
    method: SyncMethod
    model: nn.Module  # its own replica: a method may hook into its model's backward
    net: nn.Module
    overlapped: bool = False  # sends during backward: sync() waits for what is still in flight


def contender(name: str, method: SyncMethod, template: nn.Module) -> Contender:
    """`method` on its own copy of `template`."""
    model = copy.deepcopy(template)
    return Contender(name=name, method=method, model=model, net=method.wrap(model),
                     overlapped=method.traits.overlapped())


def configured(text: str, bucket_mb: float, powersgd_rank: int = DEFAULT_RANK,
               precision: str = "32-true", workload: TrainConfig | None = None) -> SyncMethod:
    """The method a label names, as the bench runs it at --precision `precision` (resolved: fsdp gathers its
    parameters in it) for the model `workload` names (DDP's methods ask it for parameters no logit depends on):
    PowerSGD compresses from the first step (the steady state is measured)."""
    if text == NO_SYNC:
        return NoSync()
    name, compression = split_label(text)
    config = replace(workload or TrainConfig(), sync=name, compression=compression, bucket_mb=bucket_mb,
                     powersgd_rank=powersgd_rank, powersgd_start_step=0,
                     period=1,  # a model-averaging method: one average a step, its cost
                     precision=precision)
    return build_method(name, config)


def contenders(workload: TrainConfig, device: torch.device, bucket_mb: float, labels: list[str] | None = None,
               backend: str = "gloo",
               powersgd_rank: int = DEFAULT_RANK,
               precision: str = "32-true") -> tuple[list[Contender], list[tuple[str, str]]]:
    """The no-sync baseline and each method at `precision`, each with an identical replica of the model `workload`
    names; and the methods the backend cannot run, with the reason."""
    torch.manual_seed(0)
    template = workload.make_model().to(device)
    entries, unavailable = [], []
    for text in [NO_SYNC, *(labels or parse_labels(None))]:
        refused = backend_error(split_label(text)[0], backend) if text != NO_SYNC else None
        if refused:
            unavailable.append((text, refused))
            continue
        entries.append(contender(text, configured(text, bucket_mb, powersgd_rank, precision, workload), template))
    return entries, unavailable


def gradient_bytes(model: nn.Module) -> int:
    """The bytes of the gradients a replica of `model` sums: its trainable parameters' own."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def traffic(entries: list[Contender]) -> tuple[dict[str, float], dict[str, float]]:
    """Per method label, S as the method sends it, and the share of S it sums after its first round (PowerSGD's
    Qs); the baseline, first, sends nothing."""
    methods = entries[1:]
    sent = {entry.name: netmodel.wire_bytes(entry.method, list(entry.model.parameters())) for entry in methods}
    later = {entry.name: netmodel.later_share(entry.method, list(entry.model.parameters())) for entry in methods}
    return sent, later
