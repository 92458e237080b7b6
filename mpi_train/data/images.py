"""Image files decoded as torchvision's image folders decode them, with a file that cannot be read or decoded named
by its path: a damaged image is the user's to remove or replace, never a disk fault or a traceback."""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image, UnidentifiedImageError

UNSCALED = "pixel values"  # how a BadImage's reason begins for a high-depth image that no 8-bit scale fits
# What PIL raises on bytes it cannot turn into pixels: the file is in memory already, so none of these is the disk's
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError)


class BadImage(Exception):
    """An image file that cannot be read (`readable` False) or decoded, with the path and the reason.

    Its arguments are all it holds, so it pickles: a DataLoader worker passes it back as a sample (loaders.py)."""

    def __init__(self, path: str, reason: str, readable: bool = True):
        super().__init__(path, reason, readable)
        self.path, self.reason, self.readable = path, reason, readable

    def __str__(self) -> str:
        if not self.readable:
            return (f"the image {self.path} cannot be read ({self.reason}). Make it readable by this user, or remove "
                    f"it or replace it with a good copy, then run again.")
        if self.reason.startswith("DecompressionBombError"):  # whole, but past the pixels Pillow decodes by default
            return (f"the image {self.path} is larger than Pillow decodes ({self.reason}; the limit guards against "
                    f"files made to exhaust memory). Downscale it (a model takes it resized to --image-size anyway), "
                    f"or remove it, then run again.")
        if self.reason.startswith(UNSCALED):  # decoded, but in a range that no 8-bit scale is known to fit
            return (f"the image {self.path} holds {self.reason}: neither 16-bit integers nor floats in [0, 1], so "
                    f"no scale to the model's 8-bit pixels is known for it. Convert the folder's images to 8 or 16 "
                    f"bits, or read them with a data set of your own (--dataset MODULE:FUNCTION) that scales them as "
                    f"you mean.")
        return (f"the image {self.path} cannot be decoded ({self.reason}): the file is damaged, or is not an image. "
                f"Remove it, or replace it with a good copy, then run again.")


def _reason(error: BaseException, size: int) -> str:
    if isinstance(error, UnidentifiedImageError):  # its own text names a BytesIO, not the file
        return f"no image format recognised in its {size:,} bytes"
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def eight_bits(image: Image.Image, path: str) -> Image.Image:
    """A greyscale image of more than 8 bits (Pillow's modes I;16*, I and F) as 8-bit greyscale, its range scaled:
    16-bit values by 1/257, floats in [0, 1] by 255. Pillow's convert("RGB"), torchvision's loader's, clips them at
    255 instead: a 16-bit PNG comes out almost white, a float TIFF black. Values no such scale fits are refused
    (UNSCALED), never guessed at. Other modes are returned as they are."""
    if not (image.mode.startswith("I") or image.mode == "F"):
        return image
    values = np.asarray(image, dtype=np.float64)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if image.mode == "F" and 0.0 <= low and high <= 1.0:
        scale = 255.0
    elif image.mode != "F" and 0 <= low and high <= 65535:
        scale = 1 / 257
    else:
        raise BadImage(path, f"{UNSCALED} from {low:g} to {high:g} (Pillow's mode {image.mode})")
    return Image.fromarray(np.rint(values * scale).astype(np.uint8), mode="L")


def read_rgb(path: str) -> Image.Image:
    """The image at `path` in RGB, decoded as torchvision's default loader decodes it but for images of more than 8
    bits, which are scaled rather than clipped (eight_bits); BadImage if the file cannot be read or its bytes cannot
    be decoded (read first, whole, so that the two are told apart)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise BadImage(path, error.strerror or str(error), readable=False) from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            return eight_bits(image, path).convert("RGB")
    except DECODE_ERRORS as error:
        raise BadImage(path, _reason(error, len(data))) from None


def pixels(path: str, prepare: Callable[[Image.Image], Image.Image] | None = None) -> np.ndarray | BadImage:
    """The image's pixels, (H, W, 3) uint8, after `prepare` (an image folder's resize), or why it has none."""
    try:
        image = read_rgb(path)
    except BadImage as bad:
        return bad
    return np.asarray(prepare(image) if prepare is not None else image)


def find_bad(paths: Sequence[str], threads: int | None = None) -> list[BadImage]:
    """Every file of `paths` that cannot be read or decoded, in their order, each decoded whole. The threads take a
    share each (PIL decodes with the GIL released): one task per file would cost more than a small image's decoding."""
    count = max(1, min(threads or os.cpu_count() or 1, len(paths)))

    def share(first: int) -> list[BadImage]:
        return [bad for path in paths[first::count] if isinstance(bad := pixels(path), BadImage)]

    with ThreadPoolExecutor(max_workers=count) as pool:
        found = [bad for part in pool.map(share, range(count)) for bad in part]
    order = {path: index for index, path in enumerate(paths)} if len(found) > 1 else {}
    return sorted(found, key=lambda bad: order.get(bad.path, 0))


def describe(bad: Sequence[BadImage]) -> str:
    """One paragraph for the files that failed: the first named in full, how many more, and the next one."""
    message = str(bad[0])
    if len(bad) > 1:
        message += (f" {len(bad) - 1:,} more image(s) cannot be read or decoded either, e.g. {bad[1].path} "
                    f"({bad[1].reason}).")
    return message
