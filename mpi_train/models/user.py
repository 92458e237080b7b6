"""A model of the user's own: `--model my_package.my_module:build` names a callable that the job imports and calls.

The contract, once: `build(num_classes, input_shape)` returns a `torch.nn.Module` that maps a float batch of images
(batch, *input_shape) to logits (batch, num_classes); num_classes is the data set's (10 for cifar10, mnist and
synthetic, the class folders of an image folder, what a data set of the user's own says), input_shape its (channels,
height, width), for --dataset synthetic (3, 32, 32). A callable that takes fewer arguments gets the first ones
(`build(num_classes)`, or `build()` for a model whose classes are fixed, which the job then checks against the data
set's). The module must be importable on every host of the job (installed there, or on PYTHONPATH, which mpirun -x
PYTHONPATH passes on). `load` imports any MODULE:ATTRIBUTE, for --dataset's data set of the user's own as well.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from ..errors import UserError

CONTRACT = ("MODULE:CALLABLE names a callable build(num_classes, input_shape) returning a torch.nn.Module that maps a "
            "float batch (batch, *input_shape) to logits (batch, num_classes); num_classes and input_shape (channels, "
            "height, width) are the data set's, for --dataset synthetic (3, 32, 32); a callable that takes fewer "
            "arguments gets the first ones")


def is_path(name: str) -> bool:
    return ":" in name


def why(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its text."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def load(path: str, flag: str = "--model", contract: str = CONTRACT) -> Callable:
    """The callable `path` (module:attribute) names; a UserError naming the flag, the path and the contract if it
    cannot be imported or is not callable."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise UserError(f"{flag} {path} is not MODULE:CALLABLE (e.g. my_package.my_module:build). {contract}.")
    try:
        target = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - a missing module or one that fails while importing: both the user's
        raise UserError(f"{flag} {path}: importing {module_name} failed ({why(error)}). The module must be "
                        f"importable on every host of the job (installed there, or on PYTHONPATH, passed on by "
                        f"mpirun -x PYTHONPATH). {contract}.") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UserError(f"{flag} {path}: {module_name} has no attribute {attribute}. {contract}.")
        target = getattr(target, part)
    if not callable(target):
        raise UserError(f"{flag} {path}: {attribute} is a {type(target).__name__}, not a callable. {contract}.")
    return target


def leading(function: Callable, arguments: tuple) -> tuple:
    """The first of `arguments` that `function` takes positionally: all of them when it takes as many or more (or
    *args), or when its signature cannot be read."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or extension callable without a readable signature
        return arguments
    if any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters):
        return arguments
    taken = [parameter for parameter in parameters
             if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    return arguments[:len(taken)]


def build(path: str, num_classes: int, input_shape: tuple[int, ...]):
    """Call the user's callable; a UserError naming the path if it raises or returns anything but an nn.Module."""
    from torch import nn  # here, not at the top: only a job on a user's model builds one

    make = load(path)
    arguments = leading(make, (num_classes, input_shape))
    try:
        model = make(*arguments)
    except Exception as error:  # noqa: BLE001 - whatever the user's code raises is reported the same way
        called = ", ".join(map(repr, arguments))
        raise UserError(f"--model {path}: calling it as build({called}) raised {why(error)}. {CONTRACT}.") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"--model {path} returned {type(model).__module__}.{type(model).__qualname__}, not a "
                        f"torch.nn.Module. {CONTRACT}.")
    return model
