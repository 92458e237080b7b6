"""The augmentation of whole batches, on the device the batch lives on.

CIFAR-10's (`CropFlip`): the same distribution as torchvision's `RandomCrop(32, padding=4)` +
`RandomHorizontalFlip()` per image (each image its own offsets, 9 x 9 equally likely, and its own coin for the flip),
then `ToTensor` + `Normalize`, computed as they compute it so that a batch equals theirs bit for bit given the same
draws. A crop and a flip are one gather: every (row offset, column offset, flip) maps the 32 x 32 output onto the
padded 40 x 40 image, and those 162 maps are a small table built once, so a batch costs one pad, one gather and the
normalisation (about 127,000 images/s on one CPU thread here; airbench does the same on GPUs with masks).

An image folder's (`ResizedCropFlip`, `CentreCrop`): torchvision's `RandomResizedCrop(S)` + flip to train, each
image's box drawn as its `get_params` draws it (area 8% to 100%, aspect ratio 3/4 to 4/3 uniform in its log, ten
tries, then the whole square), all boxes of a batch resampled to S x S in one `grid_sample`, each output pixel read
where a bilinear resize of its crop reads it (equal to torchvision's resize of the crop to float rounding; a box
larger than S, at most 8/7 of it, is shrunk without the antialiasing torchvision's resize adds); the centre S x S
to evaluate, a slice equal bit for bit to `CenterCrop(S)`.

Each augmentation draws a pass's parameters up front (`draw`), per position, from a generator of its own, and
applies a batch's share of them (`__call__`); `random` says whether it draws at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PADDING = 4
SHIFTS = 2 * PADDING + 1  # offsets 0..8 in each direction, as RandomCrop draws them
SCALE, RATIO, TRIES = (0.08, 1.0), (3 / 4, 4 / 3), 10  # RandomResizedCrop's defaults and its attempts per image


@dataclass(frozen=True)
class Draws:
    """One epoch's augmentation for each of a rank's positions in it: row and column offsets and the flip."""

    rows: torch.Tensor
    cols: torch.Tensor
    flips: torch.Tensor

    def __getitem__(self, where: slice) -> Draws:
        return Draws(self.rows[where], self.cols[where], self.flips[where])


def draw(count: int, generator: torch.Generator, device: torch.device) -> Draws:
    """Offsets uniform in 0..8 and a fair coin per image, from the augmentation's own generator (never torch's
    global one, so dropout and everything else draw the same whatever the data path)."""
    rows = torch.randint(0, SHIFTS, (count,), generator=generator, device=device)
    cols = torch.randint(0, SHIFTS, (count,), generator=generator, device=device)
    flips = torch.randint(0, 2, (count,), generator=generator, device=device)
    return Draws(rows, cols, flips)


def crop_maps(size: int, device: torch.device) -> torch.Tensor:
    """(SHIFTS * SHIFTS * 2, size * size): for each (row offset, column offset, flip), where each output pixel
    is read from in the padded image, flattened."""
    padded = size + 2 * PADDING
    pixels = torch.arange(size)
    maps = torch.empty(SHIFTS, SHIFTS, 2, size * size, dtype=torch.int64)
    for row in range(SHIFTS):
        for col in range(SHIFTS):
            for flip, columns in enumerate((pixels, pixels.flip(0))):
                maps[row, col, flip] = ((row + pixels).view(-1, 1) * padded + (col + columns).view(1, -1)).flatten()
    return maps.view(-1, size * size).to(device)


class Normalise:
    """ToTensor's scaling and Normalize's shift, in their order of operations (equal bits), on the batch's device."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...], device: torch.device):
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return images.float().div_(255).sub_(self.mean).div_(self.std)


class CropFlip:
    """Random crop with zero padding and horizontal flip of a uint8 batch (N, C, H, W), square images."""

    random = True

    def __init__(self, size: int, device: torch.device):
        self.size, self.device = size, device
        self.maps = crop_maps(size, device)

    def draw(self, count: int, generator: torch.Generator) -> Draws:
        return draw(count, generator, self.device)

    def __call__(self, images: torch.Tensor, draws: Draws) -> torch.Tensor:
        count, channels = images.shape[:2]
        padded = F.pad(images, (PADDING,) * 4).view(count, channels, -1)
        which = (draws.rows * SHIFTS + draws.cols) * 2 + draws.flips
        where = self.maps[which].unsqueeze(1).expand(-1, channels, -1)
        return torch.gather(padded, 2, where).view(count, channels, self.size, self.size)


@dataclass(frozen=True)
class Boxes:
    """One pass's random resized crops for each of a rank's positions: the box (top, left, height, width) in the
    stored square, and the flip."""

    tops: torch.Tensor
    lefts: torch.Tensor
    heights: torch.Tensor
    widths: torch.Tensor
    flips: torch.Tensor

    def __getitem__(self, where: slice) -> Boxes:
        return Boxes(tops=self.tops[where], lefts=self.lefts[where], heights=self.heights[where],
                     widths=self.widths[where], flips=self.flips[where])


def draw_boxes(count: int, side: int, generator: torch.Generator, device: torch.device) -> Boxes:
    """RandomResizedCrop.get_params for `count` images of side x side at once: TRIES candidate boxes each (an area
    drawn in SCALE of the image's, an aspect ratio uniform in log between RATIO's ends), the first that fits kept, the
    whole square where none does (a square's fallback), then a uniform offset and a fair coin for the flip."""
    area = side * side * (SCALE[0] + (SCALE[1] - SCALE[0]) * torch.rand(count, TRIES, generator=generator,
                                                                        device=device, dtype=torch.float64))
    low, high = math.log(RATIO[0]), math.log(RATIO[1])
    ratio = torch.exp(low + (high - low) * torch.rand(count, TRIES, generator=generator, device=device,
                                                      dtype=torch.float64))
    widths, heights = torch.sqrt(area * ratio).round().long(), torch.sqrt(area / ratio).round().long()
    fits = (widths > 0) & (widths <= side) & (heights > 0) & (heights <= side)
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)  # the first try that fits (0 where none does)
    found = fits.any(dim=1)
    width = torch.where(found, widths.gather(1, first).squeeze(1), side)
    height = torch.where(found, heights.gather(1, first).squeeze(1), side)
    offsets = torch.rand(2, count, generator=generator, device=device, dtype=torch.float64)
    tops = (offsets[0] * (side - height + 1)).long().clamp_(max=side - height)
    lefts = (offsets[1] * (side - width + 1)).long().clamp_(max=side - width)
    flips = torch.randint(0, 2, (count,), generator=generator, device=device)
    return Boxes(tops=tops, lefts=lefts, heights=height, widths=width, flips=flips)


class ResizedCropFlip:
    """Random resized crop to size x size and horizontal flip of a uint8 batch of stored squares (N, C, R, R); float
    pixels out (0..255, not rounded), for Normalise."""

    random = True

    def __init__(self, size: int, side: int, device: torch.device):
        self.size, self.side, self.device = size, side, device
        self.steps = (torch.arange(size, device=device, dtype=torch.float64) + 0.5) / size  # output pixel centres

    def draw(self, count: int, generator: torch.Generator) -> Boxes:
        return draw_boxes(count, self.side, generator, self.device)

    def _sources(self, starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Where each output pixel along one axis reads its box, as a resize of the crop computes it (pixel centres
        scaled, then kept inside the crop's first and last pixel), in grid_sample's -1..1 of the stored square."""
        first = starts.to(torch.float64).unsqueeze(1)
        places = first + self.steps * lengths.unsqueeze(1) - 0.5
        places = torch.minimum(torch.maximum(places, first), first + lengths.unsqueeze(1) - 1)
        return ((places + 0.5) * 2 / self.side - 1).to(torch.float32)

    def __call__(self, images: torch.Tensor, boxes: Boxes) -> torch.Tensor:
        count, size = len(images), self.size
        columns = self._sources(boxes.lefts, boxes.widths)
        columns = torch.where(boxes.flips.view(-1, 1).bool(), columns.flip(1), columns)
        rows = self._sources(boxes.tops, boxes.heights)
        grid = torch.stack([columns.view(count, 1, size).expand(-1, size, -1),
                            rows.view(count, size, 1).expand(-1, -1, size)], dim=-1)
        return F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)


class CentreCrop:
    """The centre size x size of a batch of squares, where torchvision's CenterCrop takes it (equal pixels)."""

    random = False

    def __init__(self, size: int, side: int):
        self.size, self.offset = size, round((side - size) / 2)  # CenterCrop's rounding

    def __call__(self, images: torch.Tensor, draws=None) -> torch.Tensor:
        where = slice(self.offset, self.offset + self.size)
        return images[..., where, where]
