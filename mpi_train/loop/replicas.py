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


def parameter_digest(tensors: nn.Module | list[torch.Tensor]) -> str:
    """A hash of every parameter's (or tensor's) exact bytes: equal digests mean identical replicas."""
    digest = hashlib.sha256()
    for tensor in tensors.parameters() if isinstance(tensors, nn.Module) else tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def check_replicas_agree(cluster: Cluster, model: nn.Module | list[torch.Tensor], when: str) -> None:
    """Compare every rank's parameter digest with rank 0's (or of the tensors a sync method keeps equal: local SGD's
    last average); collective."""
    digests = cluster.allgather(parameter_digest(model))
    differing = [rank for rank, d in enumerate(digests) if d != digests[0]]
    if differing:
        raise UserError(
            f"{when}, rank(s) {differing} hold different weights from rank 0. Every rank must run "
            f"the same code, torch version and --seed; a sync method that does not average every "
            f"gradient also causes this."
        )
