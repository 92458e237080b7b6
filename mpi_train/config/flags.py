"""TrainConfig's fields as command-line flags: training's parser, and the model flags of the tools that build the
model without training it."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Sequence

from ..models import HELP as MODEL_HELP
from .fields import REGISTRIES
from .train_config import TrainConfig


def add_config_arguments(parser, names: Sequence[str] | None = None, defaults: dict | None = None,
                         helps: dict | None = None) -> None:
    """TrainConfig's fields (all, or those `names`) as flags of `parser`, their help the fields' own; `defaults` and
    `helps` (by field name) replace a field's default and help for this parser."""
    defaults, helps = defaults or {}, helps or {}
    for config_field in dataclasses.fields(TrainConfig):
        if names is not None and config_field.name not in names:
            continue
        meta = {key: value for key, value in config_field.metadata.items() if key not in ("choices", "also")}
        choices = field_choices(config_field.name)
        meta["help"] = helps.get(config_field.name, meta["help"])
        flag = "--" + config_field.name.replace("_", "-")
        kind = field_kinds()[config_field.name]
        if kind is bool:  # on/off switches: present means on
            parser.add_argument(flag, action="store_true", **meta)
            continue
        default = defaults.get(config_field.name, config_field.default)
        if default is not None and "default" not in meta["help"]:
            meta["help"] += f" (default: {default})"
        parser.add_argument(flag, type=kind, default=default, choices=choices, **meta)


@functools.cache
def field_kinds() -> dict[str, type]:
    """What each field holds when set: bool, int, float or str (an `int | None` field holds an int)."""
    return {name: next((a for a in typing.get_args(hint) if a is not type(None)), hint)
            for name, hint in typing.get_type_hints(TrainConfig).items()}


def field_choices(name: str) -> tuple | None:
    """The values field `name` takes, as its flag offers them (a registry's keys and the words its `also` adds);
    None: any value of its type."""
    meta = TrainConfig.__dataclass_fields__[name].metadata
    choices = meta.get("choices")
    return (*REGISTRIES[choices], *meta.get("also", ())) if isinstance(choices, str) else choices


# The flags that name the model, for the commands that build it without training it (bench, advise, predict,
# gpu-check): the same names, help and checks as training's.
MODEL_FLAGS = ("model", "gpt_size", "gpt_layers", "gpt_heads", "gpt_width", "context")
TOOL_DATASETS = ("synthetic", "cifar10", "mnist", "text")


def add_model_arguments(parser, default_model: str = "vgg11", dataset: bool = True) -> None:
    """--model and gpt's size flags as training takes them, and (with `dataset`) --dataset: whose samples' shape the
    model is built for (the tool feeds it synthetic data of that shape)."""
    training_default = " (default: vgg11 for cifar10"  # what training's help says of its default; here it is one model
    add_config_arguments(parser, MODEL_FLAGS, defaults={"model": default_model},
                         helps={"model": MODEL_HELP.split(training_default)[0] + f" (default: {default_model})"})
    if not dataset:
        parser.set_defaults(dataset="synthetic")
        return
    parser.add_argument("--dataset", choices=TOOL_DATASETS, default="synthetic",
                        help="the data set whose samples the model is built for: cifar10 and mnist its images' "
                             "shape, text or synthetic what the model takes (images 3x32x32 or the smallest it "
                             "accepts, tokens of gpt's context); the samples themselves are synthetic "
                             "(default: synthetic)")


def model_config(args, **settings) -> TrainConfig:
    """The TrainConfig of add_model_arguments' flags (and `settings`), its model checked as training checks it: a
    UserError names what is wrong."""
    config = TrainConfig(**model_flags(args), **settings)
    config.validate_model()
    return config


def model_flags(args) -> dict:
    """add_model_arguments' flags as given (a bench JSON keeps them, so predict can tell its model from another)."""
    return {name: getattr(args, name) for name in (*MODEL_FLAGS, "dataset")}


def model_flag_words(args) -> list[str]:
    """The model flags to repeat on a training command line: --model and each gpt flag given."""
    words = ["--model", args.model]
    for name in MODEL_FLAGS[1:]:
        value = getattr(args, name)
        if value is not None and value != getattr(TrainConfig, name):
            words += ["--" + name.replace("_", "-"), str(value)]
    return words

