"""Batch augmentation against torchvision's per-image transforms: the same pixels, the same distribution."""

import itertools

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from mpi_train.data.augment import PADDING, SHIFTS, CropFlip, Normalise, draw
from mpi_train.data.sets import CIFAR10_MEAN, CIFAR10_STD

CPU = torch.device("cpu")


def torchvision_view(image: np.ndarray, row: int, col: int, flip: int) -> torch.Tensor:
    """What RandomCrop(32, padding=4) + RandomHorizontalFlip + ToTensor + Normalize give for these draws."""
    picture = TF.crop(TF.pad(Image.fromarray(image), PADDING), row, col, 32, 32)
    picture = TF.hflip(picture) if flip else picture
    return T.Normalize(CIFAR10_MEAN, CIFAR10_STD)(T.ToTensor()(picture))


def test_every_crop_and_flip_equals_torchvisions_bit_for_bit():
    images = np.random.default_rng(0).integers(0, 256, (SHIFTS * SHIFTS * 2, 32, 32, 3), dtype=np.uint8)
    combos = list(itertools.product(range(SHIFTS), range(SHIFTS), range(2)))
    rows, cols, flips = (torch.tensor(column) for column in zip(*combos))
    batch = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    draws = draw(len(combos), torch.Generator().manual_seed(0), CPU)
    draws = type(draws)(rows, cols, flips)
    ours = Normalise(CIFAR10_MEAN, CIFAR10_STD, CPU)(CropFlip(32, CPU)(batch, draws))
    theirs = torch.stack([torchvision_view(image, *combo) for image, combo in zip(images, combos)])
    assert torch.equal(ours, theirs)


def test_offsets_and_flips_are_uniform_and_independent():
    count = 162_000
    draws = draw(count, torch.Generator().manual_seed(1), CPU)
    for values, kinds in ((draws.rows, SHIFTS), (draws.cols, SHIFTS), (draws.flips, 2)):
        assert values.min() == 0 and values.max() == kinds - 1
        frequencies = torch.bincount(values, minlength=kinds).double() / count
        assert torch.allclose(frequencies, torch.full((kinds,), 1 / kinds, dtype=torch.float64), atol=0.006)
    joint = torch.bincount((draws.rows * SHIFTS + draws.cols) * 2 + draws.flips, minlength=162).double()
    expected = count / 162
    chi_square = float(((joint - expected) ** 2 / expected).sum())
    assert chi_square < 230  # 161 degrees of freedom: above 230 has odds under 1 in 10,000 for fair draws


def test_draws_come_from_their_own_generator():
    before = torch.get_rng_state()
    first = draw(100, torch.Generator().manual_seed(5), CPU)
    again = draw(100, torch.Generator().manual_seed(5), CPU)
    other = draw(100, torch.Generator().manual_seed(6), CPU)
    assert torch.equal(torch.get_rng_state(), before)  # torch's global stream untouched
    assert torch.equal(first.rows, again.rows) and torch.equal(first.flips, again.flips)
    assert not torch.equal(first.rows, other.rows)


@pytest.mark.parametrize("size", [28, 32])
def test_a_centred_unflipped_crop_is_the_image(size):
    images = torch.randint(0, 256, (4, 3, size, size), dtype=torch.uint8)
    centre = torch.full((4,), PADDING)
    draws = draw(4, torch.Generator().manual_seed(0), CPU)
    assert torch.equal(CropFlip(size, CPU)(images, type(draws)(centre, centre, torch.zeros(4, dtype=torch.int64))),
                       images)
