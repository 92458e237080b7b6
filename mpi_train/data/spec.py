"""What the model is built for, before any data is loaded: the data set's image shape and class count.

TrainConfig asks this while validating its flags (config/train_config.py's `data_spec`), so it imports nothing
that imports the configuration: it is given the data sets' names and shapes, and reads an image folder's classes or
calls the user's own data set itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from ..errors import UserError
from ..models import NUM_CLASSES
from ..models.user import is_path
from . import folders
from . import user as user_data


def image_size(given: int | None) -> int:
    """--image-size, or its default."""
    return given if given is not None else folders.DEFAULT_IMAGE_SIZE


def data_spec(dataset: str, data_dir: str, size: int | None, shapes: Mapping[str, tuple[int, ...]],
              names: Collection[str]) -> tuple[tuple[int, ...] | None, int]:
    """The image shape of `dataset` (`shapes`' for the named ones; None: synthetic images, made in the model's, or
    text) and its class count. An image folder's classes are its train/ folders (a listing, nothing decoded); a data
    set of the user's own is loaded (once per process) and its first items say. A UserError for a name that is none
    of `names` nor MODULE:FUNCTION, and for --image-size (`size`) with a data set that would ignore it."""
    if size is not None and dataset != "imagefolder":
        raise UserError(f"--image-size is read by --dataset imagefolder only, and this job reads --dataset {dataset}, "
                        f"whose images keep their size. Drop --image-size.")
    if dataset == "imagefolder":
        side = image_size(size)
        if side < 1:
            raise UserError(f"--image-size must be positive, got {side}.")
        return (3, side, side), len(folders.classes(Path(data_dir)))
    if is_path(dataset):
        data = user_data.load(dataset, data_dir)
        return data.shape, data.num_classes
    if dataset not in names:
        raise UserError(f"--dataset {dataset} is not a data set this tool reads: {', '.join(names)}, or your own as "
                        f"MODULE:FUNCTION ({user_data.CONTRACT}).")
    return shapes.get(dataset), NUM_CLASSES
