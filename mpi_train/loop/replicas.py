"""Identical replicas: the one seed every rank starts from, and the check that their weights are still equal."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch
from torch import nn

from ..cluster import Cluster
from ..errors import UserError


def seed_everything(seed: int) -> None:
    """The same seed on every rank, before the model is built, so replicas start identical."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _digest(tensors) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def parameter_digest(tensors: nn.Module | list[torch.Tensor]) -> str:
    """A hash of every parameter's (or tensor's) exact bytes: equal digests mean identical replicas."""
    return _digest(tensors.parameters() if isinstance(tensors, nn.Module) else tensors)


# said when the replicas differ as the job starts: the model's build made them differ
BUILT_APART = ("At the start the model's build made them: a model of your own must draw its first weights from "
               "torch's random generator, which every rank seeds alike, not from the process, the host, the time or a "
               "generator of its own.")


def check_replicas_agree(cluster: Cluster, model: nn.Module | list[torch.Tensor], when: str, cause: str = "") -> None:
    """Compare every rank's parameter digest with rank 0's (or of the tensors a sync method keeps equal: local SGD's
    last average); collective. Where a model's differ, every rank digests each parameter apart too, to name the first
    that differs; `cause` says what differing `when` means."""
    digests = cluster.allgather(parameter_digest(model))
    differing = [rank for rank, d in enumerate(digests) if d != digests[0]]
    if differing:
        where = ""
        if isinstance(model, nn.Module):
            named = list(model.named_parameters())
            each = cluster.allgather([_digest([parameter]) for _, parameter in named])
            first = next((name for (name, _), ours, theirs in zip(named, each[0], each[differing[0]])
                          if ours != theirs), None)
            where = f" (the first that differs: {first})" if first else ""
        raise UserError(
            f"{when}, rank(s) {differing} hold different weights from rank 0{where}. Every rank must run "
            f"the same code, torch version and --seed; a sync method that does not average every "
            f"gradient also causes this.{' ' + cause if cause else ''}"
        )
