"""A model of the user's own: `--model my_package.my_module:build` names a callable that the job imports and calls.

The contract, once: `build(num_classes, input_shape)` returns a `torch.nn.Module` that maps a float batch of images
(batch, *input_shape) to logits (batch, num_classes); input_shape is the data set's (channels, height, width), for
--dataset synthetic (3, 32, 32). The module must be importable on every host of the job (installed there, or on
PYTHONPATH, which mpirun -x PYTHONPATH passes on).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ..errors import UserError

CONTRACT = ("MODULE:CALLABLE names a callable build(num_classes, input_shape) returning a torch.nn.Module that maps a "
            "float batch (batch, *input_shape) to logits (batch, num_classes); input_shape is the data set's "
            "(channels, height, width), for --dataset synthetic (3, 32, 32)")


def is_path(name: str) -> bool:
    return ":" in name


def _why(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def load(path: str) -> Callable:
    """The callable `path` (module:attribute) names; a UserError naming the path and the contract if it cannot be
    imported or is not callable."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise UserError(f"--model {path} is not MODULE:CALLABLE (e.g. my_package.my_module:build). {CONTRACT}.")
    try:
        target = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - a missing module or one that fails while importing: both the user's
        raise UserError(f"--model {path}: importing {module_name} failed ({_why(error)}). The module must be "
                        f"importable on every host of the job (installed there, or on PYTHONPATH, passed on by "
                        f"mpirun -x PYTHONPATH). {CONTRACT}.") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UserError(f"--model {path}: {module_name} has no attribute {attribute}. {CONTRACT}.")
        target = getattr(target, part)
    if not callable(target):
        raise UserError(f"--model {path}: {attribute} is a {type(target).__name__}, not a callable. {CONTRACT}.")
    return target


def build(path: str, num_classes: int, input_shape: tuple[int, ...]):
    """Call the user's callable; a UserError naming the path if it raises or returns anything but an nn.Module."""
    from torch import nn  # here, not at the top: only a job on a user's model builds one

    make = load(path)
    try:
        model = make(num_classes, input_shape)
    except Exception as error:  # noqa: BLE001 - whatever the user's code raises is reported the same way
        raise UserError(f"--model {path}: calling it as build({num_classes}, {input_shape}) raised {_why(error)}. "
                        f"{CONTRACT}.") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"--model {path} returned {type(model).__module__}.{type(model).__qualname__}, not a "
                        f"torch.nn.Module. {CONTRACT}.")
    return model
