"""Batches served from tensors held on the rank's device: no DataLoader, no per-sample Python, no host copies.

The whole split lives where the model computes (GPU memory under NCCL; on CPUs the cache file mapped into RAM,
shared by the host's ranks), as uint8 where it came from images. A training batch is an index into it, taken
from the same seeded DistributedSampler as the DataLoader path (so every step's global batch, and where a resumed
job lands, are unchanged), then cropped, flipped and normalised as one batch on that device (augment.py). The
augmentation draws each epoch's crops and flips up front, per position in the rank's pass, from a generator
seeded by (seed, rank, epoch): a resumed pass that starts part-way takes the draws of its positions, exactly as
the uninterrupted job did.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .augment import Normalise
from .sampler import ResumableSampler


def augmentation_seed(seed: int, rank: int, epoch: int) -> int:
    """A 63-bit seed of its own for each (seed, rank, epoch)."""
    return int(np.random.SeedSequence([seed, rank, epoch]).generate_state(2, dtype=np.uint64)[0] >> 1)


class ResidentSplit:
    """A split on the device: its images (uint8, or float already prepared), labels, and how to prepare a batch:
    `view`, an augmentation of augment.py (random: training's crops and flips, drawn per pass; or a centre crop), then
    the normalisation."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, device: torch.device,
                 normalise: tuple[tuple[float, ...], tuple[float, ...]] | None, view=None):
        self.images, self.labels = images.to(device), labels.to(device)
        self.device = device
        self.normalise = Normalise(*normalise, device) if normalise else None
        self.view = view

    @property
    def nbytes(self) -> int:
        return self.images.nbytes + self.labels.nbytes

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def random(self) -> bool:
        """Whether its batches take draws (training's augmentation)."""
        return self.view is not None and self.view.random

    def batch(self, indices: torch.Tensor, draws=None) -> tuple[torch.Tensor, torch.Tensor]:
        images = self.images[indices]
        if self.view is not None and (draws is not None or not self.view.random):
            images = self.view(images, draws)
        if self.normalise is not None:
            images = self.normalise(images)
        return images, self.labels[indices]


class ResidentTrainLoader:
    """The rank's training batches of one pass, in its sampler's order, augmented on the device."""

    def __init__(self, split: ResidentSplit, sampler: ResumableSampler, batch_size: int, seed: int, rank: int):
        self.split, self.sampler, self.batch_size, self.seed, self.rank = split, sampler, batch_size, seed, rank

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self):
        start, order = self.sampler.next_pass()
        device = self.split.device
        indices = torch.tensor(order, dtype=torch.int64).to(device)
        draws = None
        if self.split.random:
            generator = torch.Generator(device=device)
            generator.manual_seed(augmentation_seed(self.seed, self.rank, self.sampler.epoch))
            draws = self.split.view.draw(len(order), generator)
        # a resumed pass starts at `start`, keeping the batch boundaries of the uninterrupted one
        for first in range(start, len(order), self.batch_size):
            where = slice(first, first + self.batch_size)
            yield self.split.batch(indices[where], draws[where] if draws is not None else None)


class ResidentTestLoader:
    """The rank's strided shard of the test split (each test image scored by exactly one rank), in order."""

    def __init__(self, split: ResidentSplit, rank: int, world_size: int, batch_size: int):
        self.split, self.batch_size = split, batch_size
        self.indices = torch.arange(rank, len(split), world_size, device=split.device)

    def __len__(self) -> int:
        return math.ceil(len(self.indices) / self.batch_size)

    def __iter__(self):
        for first in range(0, len(self.indices), self.batch_size):
            yield self.split.batch(self.indices[first:first + self.batch_size])
