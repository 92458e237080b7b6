"""The models, resolved by name in one place: the built-in ones (vgg11, mnist_cnn, gpt), any torchvision
classification model by its registry name (resnet18, resnet50, mobilenet_v3_small, ...) and the user's own
(`my_package.my_module:build`, see user.py for the contract).

A name resolves to a ModelSpec: what the model takes (images or tokens), the image shape it insists on if any, and
how to build it for a data set's classes. `check` builds the model on the meta device (no memory, no compute) and runs
a batch of the data set's shape through it, so a model that cannot take the data set's images, or gives other than
one logit per class, is refused before any work starts.
"""

from __future__ import annotations

import functools
import os
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import UserError
from . import user, vision
from .convnets import INPUT_SHAPES, MnistCNN, vgg11
from .gpt import GPT_SIZES, VOCAB_SIZE, GptShape, gpt

NUM_CLASSES = 10  # CIFAR-10's, MNIST's and synthetic's; an image folder's or the user's own data set says its own
# the data sets the built-in convnets were written for: each keeps its model's shape (another data set's images are
# refused there with the model that takes them); for any other data set they are built for its images
COURSE_DATASETS = ("cifar10", "mnist")
IMAGES, TOKENS = "images", "tokens"  # what a model takes
DEFAULT_IMAGE_SHAPE = (3, 32, 32)  # what --dataset synthetic makes for a model that takes the data set's shape
SQUARE_SIZES = (32, 64, 96, 128, 160, 224, 299)  # the sizes tried for a model that cannot take 32x32
# torchvision's models that cannot take 32x32 images (tests/models/test_registry.py probes this list)
NEED_LARGER = ("alexnet", "inception_v3", "maxvit_t", "vit_b_16", "vit_b_32", "vit_h_14", "vit_l_16", "vit_l_32")
HELP = ("model: a built-in one (vgg11, mnist_cnn, gpt), any torchvision classification model by its registry name "
        "(resnet18, resnet50, mobilenet_v3_small, ...; 3-channel images, so not MNIST's; "
        f"{', '.join(NEED_LARGER)} need images larger than 32x32 and take --dataset synthetic at the smallest size "
        f"they accept), or your own as MODULE:CALLABLE ({user.CONTRACT}) (default: vgg11 for cifar10, gpt for "
        f"text, resnet18 for imagefolder and a data set of your own, mnist_cnn otherwise)")


@dataclass(frozen=True)
class ModelSpec:
    """What a model name stands for."""

    name: str
    source: str  # "built-in", "torchvision" or "your own"
    takes: str  # IMAGES or TOKENS
    shape: tuple[int, ...] | None  # the images it insists on (the built-in convnets); None: the data set's
    make: Callable[..., nn.Module]  # (num_classes, input_shape, dropout, gpt) -> the model


def _convnet(builder) -> Callable[..., nn.Module]:
    return lambda num_classes, shape, dropout, gpt_shape: builder(num_classes=num_classes, in_channels=shape[0],
                                                                   dropout=dropout, size=tuple(shape[1:]))


BUILT_IN = {
    "vgg11": ModelSpec("vgg11", "built-in", IMAGES, INPUT_SHAPES["vgg11"], _convnet(vgg11)),
    "mnist_cnn": ModelSpec("mnist_cnn", "built-in", IMAGES, INPUT_SHAPES["mnist_cnn"], _convnet(MnistCNN)),
    "gpt": ModelSpec("gpt", "built-in", TOKENS, None, lambda num_classes, shape, dropout, gpt_shape: gpt(gpt_shape,
                                                                                                         dropout)),
}


def _set_dropout(model: nn.Module, dropout: float | None) -> nn.Module:
    """--dropout on a model that has no dropout argument: every Dropout layer takes it."""
    if dropout is not None:
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = dropout
    return model


def _torchvision(name: str) -> ModelSpec:
    return ModelSpec(name, "torchvision", IMAGES, None, lambda num_classes, shape, dropout, gpt_shape: _set_dropout(
        vision.build(name, num_classes), dropout))


def _users(path: str) -> ModelSpec:
    user.load(path)  # an import error is the user's to see now, on every rank, before anything waits on others
    return ModelSpec(path, "your own", IMAGES, None, lambda num_classes, shape, dropout, gpt_shape: _set_dropout(
        user.build(path, num_classes, shape), dropout))


@functools.cache
def resolve(name: str) -> ModelSpec:
    """The model `name` stands for; a UserError listing what exists when it is none."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    if user.is_path(name):
        return _users(name)
    known = vision.names()
    if name in known:
        return _torchvision(name)
    raise UserError(f"--model {name} is not a model this tool knows. Built in: {', '.join(BUILT_IN)}; torchvision's "
                    f"classification models: {', '.join(known)}; or your own as MODULE:CALLABLE ({user.CONTRACT}).")


def num_classes(spec: ModelSpec, classes: int = NUM_CLASSES) -> int:
    """The model's outputs per sample: a logit per byte value for a language model, else one per class."""
    return VOCAB_SIZE if spec.takes == TOKENS else classes


def example(spec: ModelSpec, shape: tuple[int, ...], batch: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of zeros of the right kind and its labels: images and one label each, or tokens and one target per
    position (flattened, as the GPT's logits are)."""
    if spec.takes == TOKENS:
        return (torch.zeros(batch, *shape, dtype=torch.int64, device=device),
                torch.zeros(batch * shape[0], dtype=torch.int64, device=device))
    return torch.zeros(batch, *shape, device=device), torch.zeros(batch, dtype=torch.int64, device=device)


def build_model(name: str, dropout: float | None = None, input_shape: tuple[int, ...] | None = None,
                gpt_shape: GptShape | None = None, classes: int = NUM_CLASSES) -> nn.Module:
    """The model `name` for images (or tokens) of `input_shape` (default: the model's own, else 3x32x32) in
    `classes` classes."""
    spec = resolve(name)
    gpt_shape = gpt_shape or GPT_SIZES["tiny"]
    shape = input_shape or default_shape(spec, gpt_shape)
    return spec.make(num_classes(spec, classes), shape, dropout, gpt_shape)


def default_shape(spec: ModelSpec, gpt_shape: GptShape) -> tuple[int, ...]:
    """What --dataset synthetic makes for the model: the images it insists on, (3, 32, 32), or a context of
    tokens."""
    if spec.takes == TOKENS:
        return (gpt_shape.context,)
    return spec.shape or DEFAULT_IMAGE_SHAPE


def _probe(spec: ModelSpec, shape: tuple[int, ...], gpt_shape: GptShape, classes: int
           ) -> tuple[nn.Module, torch.Tensor | str, torch.Tensor, bool]:
    """The model built on the meta device (no memory, no compute), or a real copy where its builder or its forward
    cannot run there, with what it gives for a batch of two samples of `shape` (or why it fails, in one line), their
    labels, and whether its path depends on the values (then zeros took one path of several). The random streams are
    left as they were."""
    inputs, labels = example(spec, shape, 2, device="meta")
    outputs = num_classes(spec, classes)
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                model = spec.make(outputs, shape, None, gpt_shape)
        except Exception:  # noqa: BLE001 - a builder that cannot run on the meta device: probe a real copy (whose
            # own errors, the user's callable's among them, are raised from here)
            model = spec.make(outputs, shape, None, gpt_shape)
            inputs, labels = example(spec, shape, 2)
        try:
            return model, model.train()(inputs), labels, False
        except Exception as error:  # noqa: BLE001 - whatever the model's forward raises on this shape
            failed = error
        decided = inputs.is_meta and bool(NEEDS_VALUES.search(str(failed)))
        if decided:  # a forward whose path its values decide (an `if`
            # on a tensor) cannot run on the meta device, which has none: a real copy runs on zeros instead
            model = spec.make(outputs, shape, None, gpt_shape)
            inputs, labels = example(spec, shape, 2)
            try:
                return model, model.train()(inputs), labels, True
            except Exception as error:  # noqa: BLE001 - as above
                failed = error
        text = str(failed).strip().splitlines()
        return (model, f"{type(failed).__name__}: {text[0].rstrip('.') if text else ''}{raised_at(failed)}", labels,
                decided)


def raised_at(error: BaseException) -> str:
    """Where the model's own code raised `error` (its innermost frame outside torch and this package), as what
    follows the message; nothing when all of it was theirs."""
    ours = tuple(f"{folder}{os.sep}" for folder in (Path(torch.__file__).parent, Path(__file__).parents[1]))
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith(ours)]
    return f" (at {Path(frames[-1].filename).name} line {frames[-1].lineno}, in {frames[-1].name})" if frames else ""


# what torch says of an operation that needs a tensor's values, which the meta device does not hold
NEEDS_VALUES = re.compile(r"meta tensor|meta device|data-independent implementation", re.IGNORECASE)
# how a refusal says the model's logits per image differ from the data's classes
CLASS_MISMATCH = "its last layer must give one logit per class: a model function of your own is given num_classes"


def refuse_other_dtypes(spec: ModelSpec, model: nn.Module) -> None:
    """A UserError when a floating parameter is not float32: the data, the optimizer's state and the messages are,
    so a float64 layer would fail at the first step (no image size mends that)."""
    odd = [(path, param.dtype) for path, param in model.named_parameters()
           if param.is_floating_point() and param.dtype != torch.float32]
    if odd:
        names = " and ".join(sorted({str(dtype).removeprefix("torch.") for _, dtype in odd}))
        raise UserError(f"--model {spec.name} ({spec.source}) has {names} parameters (e.g. {odd[0][0]}), and the tool "
                        f"trains float32 weights. Build the model without .double(), .half() or .to(dtype); for mixed "
                        f"precision use --precision bf16-mixed or 16-mixed (autocast over float32 weights).")


def _refusal(spec: ModelSpec, shape: tuple[int, ...], gpt_shape: GptShape, classes: int = NUM_CLASSES) -> str | None:
    """Why the model cannot take a batch of `shape` and give a logit per class (None: it can)."""
    model, output, labels, _ = _probe(spec, shape, gpt_shape, classes)
    refuse_other_dtypes(spec, model)
    if isinstance(output, str):
        return output
    expected = (len(labels), num_classes(spec, classes))
    if not isinstance(output, torch.Tensor) or tuple(output.shape) != expected:
        got = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        if isinstance(output, torch.Tensor) and output.dim() == 2 and output.shape[0] == expected[0]:
            return (f"it returned {got}: {output.shape[1]} logits per image, where the data has {expected[1]} "
                    f"classes ({CLASS_MISMATCH})")
        return f"it returned {got} where the loss needs logits of shape {expected}"
    return None


@functools.cache
def untrained_parameters(name: str, shape: tuple[int, ...], gpt_shape: GptShape, classes: int = NUM_CLASSES
                         ) -> tuple[str, ...]:
    """The trainable parameters that no logit depends on, by name: backward from the probe's logits leaves them
    without a gradient, as every training step would. A user's model may hold layers its forward never calls; a
    method that sums gradients as they arrive must be told not to wait for theirs (DDP's find_unused_parameters).
    A UserError for a model with nothing to train. Call it for a model `check` has passed. The built-in models train
    every parameter (tests/models hold them to it), so they are not probed: the probe's forward and backward on the
    meta device would cost every such job's start about 0.15 s for nothing."""
    spec = resolve(name)
    return () if spec.source == "built-in" else probe_untrained(spec, shape, gpt_shape, classes)


def probe_untrained(spec: ModelSpec, shape: tuple[int, ...], gpt_shape: GptShape, classes: int) -> tuple[str, ...]:
    """untrained_parameters, found by a backward from the logits of the model built on the meta device."""
    model, output, _, decided = _probe(spec, shape, gpt_shape, classes)
    trainable = [(path, param) for path, param in model.named_parameters() if param.requires_grad]
    if not trainable:
        raise UserError(f"--model {spec.name} has no parameter that requires a gradient (every one has requires_grad "
                        f"False, or it has none): there is nothing to train. Leave requires_grad on for the layers to "
                        f"train (a frozen backbone is fine; its head must learn).")
    if decided:  # the path zeros took is one of several: what it leaves out, another may train
        return ()
    try:
        output.float().sum().backward()
    except Exception:  # noqa: BLE001 - a backward the meta device cannot run: nothing known, nothing claimed
        return ()
    return tuple(path for path, param in trainable if param.grad is None)


@functools.cache
def smallest_square(name: str) -> int | None:
    """The smallest of SQUARE_SIZES whose 3-channel images the model takes (None: none of them)."""
    spec = resolve(name)
    return next((size for size in SQUARE_SIZES if _refusal(spec, (3, size, size), GPT_SIZES["tiny"]) is None), None)


@functools.cache
def check(name: str, dataset: str, data_shape: tuple[int, ...] | None, gpt_shape: GptShape,
          classes: int = NUM_CLASSES) -> tuple[int, ...]:
    """The input shape the model trains on with `dataset` (whose images are `data_shape`; None: synthetic, made to
    fit, or text) and its `classes`; a UserError saying why and what to do when it cannot take them."""
    spec = resolve(name)
    wants_tokens = dataset == "text"
    if wants_tokens and spec.takes != TOKENS:
        raise UserError(f"--dataset text is bytes for a language model, and --model {name} takes images. Use --model "
                        f"gpt (the default for text), or an image data set for {name}.")
    if spec.takes == TOKENS and data_shape is not None:
        raise UserError(f"--model {name} is a language model and takes tokens, and {dataset} is images. Use "
                        f"--dataset text --data-dir PATH (any UTF-8 text file or folder) or --dataset synthetic.")
    if spec.takes == TOKENS:
        return (gpt_shape.context,)
    # the built-in convnets on synthetic data or a course data set: their shape, and the data set's must match it
    if spec.shape is not None and (data_shape is None or dataset in COURSE_DATASETS):
        if data_shape is not None and data_shape != spec.shape:
            raise UserError(f"--model {name} takes images of {spec.shape} (channels, height, width) and {dataset}'s "
                            f"are {data_shape}. Use the default model for {dataset}, a torchvision model such as "
                            f"resnet18, or --dataset synthetic, whose images take the model's shape.")
        return spec.shape
    if data_shape is None:  # synthetic: 3x32x32, or the smallest square the model takes
        why = _refusal(spec, DEFAULT_IMAGE_SHAPE, gpt_shape, classes)
        if why is None:
            return DEFAULT_IMAGE_SHAPE
        if CLASS_MISMATCH in why:  # it takes the images: no other size would mend its output
            raise UserError(f"--model {name} ({spec.source}) takes {dataset}'s images, but {why}.")
        size = smallest_square(name)
        if size is None:
            batch = (2, *DEFAULT_IMAGE_SHAPE)
            raise UserError(f"--model {name} takes none of the square images {', '.join(map(str, SQUARE_SIZES))} "
                            f"pixels wide (on {batch}: {why}). Its forward "
                            f"must map a float batch (batch, 3, H, W) to logits (batch, {num_classes(spec, classes)}):"
                            f" call it by hand on torch.zeros{batch} to see what it does.")
        return (3, size, size)
    why = _refusal(spec, data_shape, gpt_shape, classes)
    if why and CLASS_MISMATCH in why:
        raise UserError(f"--model {name} ({spec.source}) takes {dataset}'s images {data_shape}, but {why}.")
    if why:
        size = smallest_square(name) if spec.source == "torchvision" else None
        fix = (f"--image-size {size} makes them" if dataset == "imagefolder" else
               "--dataset synthetic makes images of that size")
        larger = f" It takes {size}x{size} images and larger: {fix}." if size and size > data_shape[-1] else ""
        channels = (" torchvision's models take 3-channel images." if data_shape[0] != 3 and spec.source ==
                    "torchvision" else "")
        examples = ("resnet18 for cifar10, mnist_cnn for mnist" if dataset in COURSE_DATASETS else
                    "resnet18" if name != "resnet18" else "vgg11")
        if data_shape[-1] in (1, 3) and data_shape[0] not in (1, 3):  # no size would mend the order of the axes
            larger, channels = "", (" Its images look like (height, width, channels) (PIL's and numpy's order): "
                                    "return them as (channels, height, width), e.g. image.permute(2, 0, 1).")
        own = (f" Make its forward map a float batch (batch, {', '.join(map(str, data_shape))}) to logits (batch, "
               f"{classes}), or pick" if spec.source == "your own" else " Pick")
        raise UserError(f"--model {name} ({spec.source}) cannot take {dataset}'s images {data_shape} (channels, "
                        f"height, width) in {classes} classes: {why}.{larger}{channels}{own} a model that takes "
                        f"them (e.g. {examples}).")
    return data_shape


__all__ = ["BUILT_IN", "GPT_SIZES", "HELP", "IMAGES", "INPUT_SHAPES", "TOKENS", "GptShape", "ModelSpec",
           "build_model", "check", "default_shape", "example", "num_classes", "probe_untrained", "resolve",
           "untrained_parameters"]
