"""Batch augmentation against torchvision's per-image transforms: the same pixels, the same distribution (CIFAR-10's
crop and flip; an image folder's random resized crop, flip and centre crop)."""

import itertools

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from mpi_train.data.augment import (
    PADDING,
    RATIO,
    SCALE,
    SHIFTS,
    Boxes,
    CentreCrop,
    CropFlip,
    Normalise,
    ResizedCropFlip,
    draw,
    draw_boxes,
)
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


def boxes_of(tops, lefts, heights, widths, flips) -> Boxes:
    return Boxes(*(torch.tensor(values) for values in (tops, lefts, heights, widths, flips)))


def test_a_resized_crop_is_torchvisions_resize_of_that_box():
    images = torch.randint(0, 256, (5, 3, 37, 37), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    whole = boxes_of([0] * 5, [0] * 5, [37] * 5, [37] * 5, [0, 1, 0, 1, 0])
    same = ResizedCropFlip(37, 37, CPU)(images, whole)  # the whole square at its own size: the image, and its mirror
    assert torch.allclose(same[0], images[0].float(), atol=1e-3)
    assert torch.allclose(same[1], images[1].float().flip(-1), atol=1e-3)
    boxes = boxes_of([3, 0, 20, 5, 1], [7, 11, 0, 2, 0], [12, 30, 17, 9, 36], [15, 20, 17, 31, 35], [0, 1, 0, 0, 1])
    ours = ResizedCropFlip(32, 37, CPU)(images, boxes)  # four boxes enlarged, the last shrunk
    for index, image in enumerate(images):
        top, left, height, width = (int(values[index]) for values in (boxes.tops, boxes.lefts, boxes.heights,
                                                                      boxes.widths))
        theirs = TF.resized_crop(image.float(), top, left, height, width, [32, 32], antialias=False)
        assert torch.allclose(ours[index], theirs.flip(-1) if boxes.flips[index] else theirs, atol=1e-3), index
        if max(height, width) <= 32:  # enlarged: antialiasing changes nothing, torchvision's default is the same
            smooth = TF.resized_crop(image.float(), top, left, height, width, [32, 32], antialias=True)
            assert torch.allclose(theirs, smooth, atol=1e-3)


def test_boxes_are_drawn_as_random_resized_crop_draws_them():
    count, side = 20_000, 73
    boxes = draw_boxes(count, side, torch.Generator().manual_seed(4), CPU)
    areas = (boxes.heights * boxes.widths).double() / side ** 2
    ratios = boxes.widths.double() / boxes.heights
    assert ((boxes.tops >= 0) & (boxes.tops + boxes.heights <= side)).all()
    assert ((boxes.lefts >= 0) & (boxes.lefts + boxes.widths <= side)).all()
    assert areas.min() > 0.06 and areas.max() <= 1 and ratios.min() > 0.7 and ratios.max() < 1.4  # rounding's slack
    theirs = [T.RandomResizedCrop.get_params(torch.zeros(1, side, side), list(SCALE), list(RATIO)) for _ in range(4000)]
    their_areas = torch.tensor([h * w for _, _, h, w in theirs], dtype=torch.float64) / side ** 2
    assert abs(areas.mean() - their_areas.mean()) < 0.015 and abs(areas.std() - their_areas.std()) < 0.015
    assert abs(boxes.flips.double().mean() - 0.5) < 0.015
    again = draw_boxes(count, side, torch.Generator().manual_seed(4), CPU)
    assert torch.equal(again.tops, boxes.tops) and torch.equal(again.widths, boxes.widths)


def test_the_centre_crop_is_torchvisions():
    images = torch.randint(0, 256, (2, 3, 37, 37), dtype=torch.uint8)
    for size in (32, 30, 37):
        assert torch.equal(CentreCrop(size, 37)(images), T.CenterCrop(size)(images))
