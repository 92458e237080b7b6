"""Where each random draw comes from: the same seed for the weights, (seed, rank) for dropout.

Replicas must start identical, so every rank seeds torch, numpy and random with --seed
before the model is built (train.seed_everything). Their other randomness must not be identical: with one seed
every rank would drop out the same way, position for position. So right after the model is built each rank
reseeds the same generators with a seed derived from (seed, rank): dropout masks (and, on the DataLoader path,
torchvision's random crops and flips and the loaders' seeds) then differ between ranks, and a rerun with the
same seed and world size draws exactly the same. The resident data path's crops and flips draw from a
generator of their own, seeded by (seed, rank, epoch) (data/resident.py). The data order is not among them:
the sampler shuffles with its own (seed, epoch) generator, the same on every rank, and hands each rank its own
shard.

A checkpoint stores these generators' states per rank (checkpoint.capture_rank_state),
so a resumed job continues each rank's stream where it stopped.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def rank_seed(seed: int, rank: int) -> int:
    """A 32-bit seed of its own for each (seed, rank); SeedSequence keeps nearby pairs' streams unrelated."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def seed_rank_streams(seed: int, rank: int) -> None:
    """Reseed the generators augmentation, dropout and the loaders draw from, differently on each rank."""
    own = rank_seed(seed, rank)
    random.seed(own)
    np.random.seed(own)
    torch.manual_seed(own)  # also seeds every CUDA device's generator
