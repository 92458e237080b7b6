"""A model of the user's own, as --model tests.user_model:build names it in the end-to-end jobs (tests/test_train.py):
what docs/training.md's contract asks, built for the data set's classes and image shape; a small one with BatchNorm
(tests/test_accumulate.py's --sync-bn jobs); the first with a layer its forward never calls, and frozen; and a data
set of the user's own whose copy differs from rank to rank."""

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset


def build(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    channels = input_shape[0]
    return nn.Sequential(nn.Conv2d(channels, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(8 * 4 * 4, num_classes))


def build_batchnorm(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    """Both kinds of BatchNorm: over images (statistics of many pixels a channel) and over features (of the samples
    alone, where how the batch is split shows most)."""
    channels = input_shape[0]
    return nn.Sequential(nn.Conv2d(channels, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 2 * 2, 16), nn.BatchNorm1d(16), nn.ReLU(),
                         nn.Linear(16, num_classes))


class WithSpare(nn.Module):
    """`build`'s model beside a layer its forward never calls: a spare left from an experiment."""

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int]):
        super().__init__()
        self.body, self.spare = build(num_classes, input_shape), nn.Linear(8, 8)

    def forward(self, images):
        return self.body(images)


def build_with_spare(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    return WithSpare(num_classes, input_shape)


def build_frozen(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    """`build`'s model with every parameter frozen: nothing to train."""
    return build(num_classes, input_shape).requires_grad_(False)


def load_per_rank():
    """--dataset tests.user_model:load_per_rank: a data set whose training split has 16 more samples on each rank
    than on the one before, as copies that differ from host to host would (called before the process group opens:
    the rank is mpirun's)."""
    count = 64 + 16 * int(os.environ["OMPI_COMM_WORLD_RANK"])
    images, labels = torch.zeros(count, 3, 8, 8), torch.arange(count) % 4
    return TensorDataset(images, labels), TensorDataset(images[:16], labels[:16]), 4
