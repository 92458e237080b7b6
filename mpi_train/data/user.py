"""A data set of the user's own: `--dataset my_package.my_data:load` names a function the job imports and calls.

The contract, once: `load(data_dir)` (or `load()`, if it takes no argument; data_dir is --data-dir) returns
`(train, test, num_classes)`: two map-style data sets (`len()` and `[index]`, as torch.utils.data.Dataset) whose
items are `(image, label)`, the image a float tensor (channels, height, width) of one shape in both, after whatever
transforms the user wants, training augmentation included, and the label an int in [0, num_classes). The job checks
the first item of each before anything starts; the model is built for that shape and num_classes. Each rank calls it
(every host must be able to import the module, as for --model MODULE:CALLABLE) and reads its shard through torch's
DataLoader: the user's transforms run per sample, as written, never on a resident copy, whose decoding and
augmentation this tool would have to know.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset, IterableDataset

from ..errors import UserError
from ..models import user as user_code

CONTRACT = ("MODULE:FUNCTION names a function load(data_dir) (or load()) that returns (train, test, num_classes): two "
            "map-style data sets (len() and [index]) whose items are (image, label), the image a float tensor "
            "(channels, height, width) of one shape in both, the label an int in [0, num_classes); docs/training.md "
            "has an example")


@dataclass(frozen=True)
class UserData:
    """What the user's function returned, checked: the two splits, the class count and the images' shape."""

    train: Dataset
    test: Dataset
    num_classes: int
    shape: tuple[int, ...]


def as_label(label):
    """An integer tensor of one element as the int it holds; anything else as it is."""
    if isinstance(label, torch.Tensor) and label.dim() == 0 and not label.is_floating_point():
        return int(label)
    return label


def is_label(label, num_classes: int) -> bool:
    """An int (not a bool) in [0, num_classes): what the loss takes as a class."""
    return not isinstance(label, bool) and isinstance(label, numbers.Integral) and 0 <= label < num_classes


class BadSample(Exception):
    """An item of the user's data set that raised or breaks the contract, with where and what: its arguments are all
    it holds, so it pickles back from a DataLoader worker as a sample (loaders.py)."""

    def __init__(self, path: str, split: str, index: int, what: str):
        super().__init__(path, split, index, what)
        self.path, self.split, self.index, self.what = path, split, index, what

    def __str__(self) -> str:
        return (f"--dataset {self.path}: its {self.split} set's item {self.index} {self.what}. Run "
                f"`{self.split}[{self.index}]` on what the function returns, in Python, to see where.")


class Named(Dataset):
    """The user's split, whose item that raises, or whose label or image the model cannot take (a label outside [0,
    num_classes) stops a CUDA kernel with a device-side assert; an image of another shape, the batch's stacking),
    comes out as its BadSample: raised in a DataLoader worker, it would come back as torch's own error with the
    worker's traceback in its text. The first item of each split was checked whole before the job began."""

    def __init__(self, split: Dataset, path: str, name: str, num_classes: int, shape: tuple[int, ...]):
        self.split, self.path, self.name = split, path, name
        self.num_classes, self.shape = num_classes, shape

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int):
        try:
            item = self.split[index]
        except Exception as error:  # noqa: BLE001 - whatever the user's code raises is reported the same way
            return BadSample(self.path, self.name, index, f"raised {user_code.why(error)}")
        broken = self._broken(item)
        return item if broken is None else BadSample(self.path, self.name, index, broken)

    def _broken(self, item) -> str | None:
        if not isinstance(item, Sequence) or len(item) != 2:
            return f"is a {type(item).__name__}, not (image, label)"
        image, label = item
        label = as_label(label)
        if not is_label(label, self.num_classes):
            return f"has the label {label!r}, not an int in [0, {self.num_classes}) (its num_classes)"
        if not isinstance(image, torch.Tensor) or tuple(image.shape) != self.shape:
            got = f"of shape {tuple(image.shape)}" if isinstance(image, torch.Tensor) else type(image).__name__
            return f"has an image {got}, where item 0's is {self.shape}: a batch stacks images of one shape"
        if not bool(torch.isfinite(image).all()):  # one such input makes the loss, then every weight, NaN
            return "has an image holding NaN or inf, on which the loss and then every weight would become NaN"
        return None


def _refused(path: str, what: str) -> UserError:
    return UserError(f"--dataset {path} {what}. {CONTRACT}.")


def _length(path: str, name: str, split) -> int:
    if isinstance(split, IterableDataset) or not (hasattr(split, "__len__") and hasattr(split, "__getitem__")):
        raise _refused(path, f"returned as its {name} set a {type(split).__module__}.{type(split).__qualname__}, "
                             f"not a map-style data set with len() and [index]")
    try:
        size = len(split)
    except Exception as error:  # noqa: BLE001 - the user's __len__
        raise _refused(path, f"returned a {name} set whose len() raised {user_code.why(error)}") from None
    if size < 1:
        raise _refused(path, f"returned an empty {name} set")
    return size


def _first_item(path: str, name: str, split, num_classes: int) -> tuple[int, ...]:
    """The shape of the split's first image, which must be a float tensor (C, H, W) with a label in range."""
    try:
        item = split[0]
    except Exception as error:  # noqa: BLE001 - the user's __getitem__
        raise _refused(path, f"returned a {name} set whose item 0 raised {user_code.why(error)}") from None
    if not isinstance(item, Sequence) or len(item) != 2:
        raise _refused(path, f"returned a {name} set whose item 0 is a {type(item).__name__}, not (image, label)")
    image, label = item
    label = as_label(label)
    if not isinstance(image, torch.Tensor) or image.dim() != 3 or image.dtype != torch.float32:
        got = (f"a {image.dtype} tensor of shape {tuple(image.shape)}" if isinstance(image, torch.Tensor) else
               f"a {type(image).__module__}.{type(image).__qualname__}")
        other_float = isinstance(image, torch.Tensor) and image.is_floating_point() and image.dim() == 3
        bytes_ = isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.dim() == 3
        fix = ("the model's weights are float32, which a float64 or float16 input does not meet: return "
               "image.float()" if other_float else
               "pixels of 0 to 255: return image.float() / 255" if bytes_ else
               "torchvision's transforms.ToTensor() makes one from a PIL image")
        raise _refused(path, f"returned a {name} set whose item 0's image is {got}, not a float32 tensor "
                             f"(channels, height, width) ({fix})")
    if not is_label(label, num_classes):
        one_hot = (isinstance(label, torch.Tensor) and label.dim() == 1 and len(label) == num_classes
                   and bool(((label == 0) | (label == 1)).all()) and int(label.sum()) == 1)
        hint = ": a one-hot vector, whose class is label.argmax()" if one_hot else ""
        raise _refused(path, f"returned a {name} set whose item 0's label is {label!r}, not an int in [0, "
                             f"{num_classes}){hint}")
    return tuple(image.shape)


@functools.cache
def load(path: str, data_dir: str) -> UserData:
    """The user's data set, called once per process (the model's check and the job's loading share it) and checked
    against the contract; a UserError naming the path and what was expected otherwise."""
    function = user_code.load(path, "--dataset", CONTRACT)
    arguments = user_code.leading(function, (data_dir,))
    try:
        returned = function(*arguments)
    except Exception as error:  # noqa: BLE001 - whatever the user's code raises is reported the same way
        called = f"{path.partition(':')[2]}({', '.join(map(repr, arguments))})"
        raise UserError(f"--dataset {path}: calling it as {called} raised {user_code.why(error)}. "
                        f"{CONTRACT}.") from None
    if not isinstance(returned, Sequence) or isinstance(returned, str) or len(returned) != 3:
        raise _refused(path, f"returned a {type(returned).__module__}.{type(returned).__qualname__}, not (train, "
                             f"test, num_classes)")
    train, test, num_classes = returned
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise _refused(path, f"returned {num_classes!r} as its class count, not a positive int")
    if num_classes == 1:  # as an image folder of one class is refused (data/folders.py)
        raise _refused(path, "returned 1 as its class count: a classifier of one class scores 100% having learnt "
                             "nothing, so there is nothing to compare; return two classes or more")
    for name, split in (("training", train), ("test", test)):
        _length(path, name, split)
    shape = _first_item(path, "training", train, int(num_classes))
    theirs = _first_item(path, "test", test, int(num_classes))
    if theirs != shape:
        raise _refused(path, f"returned training images of shape {shape} and test images of shape {theirs}: the "
                             f"model takes one shape")
    return UserData(train, test, int(num_classes), shape)
