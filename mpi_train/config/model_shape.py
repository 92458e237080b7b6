"""What shapes a job's model and its samples beyond --model and --dataset, as a checkpoint keeps it, and whether a
checkpoint's weights fit a model: a job resumes only a checkpoint of its own shape (checkpoint.check_compatible)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotations only
    from .train_config import TrainConfig


def model_shape(config: TrainConfig) -> dict:
    """What shapes the model and its samples beyond --model and --dataset, resolved from the flags: each sample's
    shape (--image-size, --context) and gpt's layers, heads and width."""
    shape = {"sample": list(config.input_shape)}
    if config.language_model:
        gpt = config.gpt_shape
        shape.update(layers=gpt.layers, heads=gpt.heads, width=gpt.width)
    return shape


def shape_words(shape: dict | None) -> str:
    """A model_shape as a person reads it: `samples 3x64x64`, `4 layers, 4 heads, width 128, context 128`."""
    if not shape:
        return ""
    if "width" in shape:
        return f"{shape['layers']} layers, {shape['heads']} heads, width {shape['width']}, context {shape['sample'][0]}"
    return "samples " + "x".join(map(str, shape["sample"]))


def shape_flags(shape: dict) -> str:
    """The flags that give a model_shape: gpt's four, or --image-size (an image folder's)."""
    if "width" in shape:
        return (f"--gpt-layers {shape['layers']} --gpt-heads {shape['heads']} --gpt-width {shape['width']} "
                f"--context {shape['sample'][0]}")
    return f"--image-size {shape['sample'][-1]}"


def unfit_weights(state: dict, shapes: dict[str, tuple], holder: str) -> str | None:
    """Why the weights `state` (a state_dict) cannot load into a model whose state tensors have `shapes`, in one
    paragraph that starts with `holder` (`--resume PATH holds step N of a gpt`); None when every tensor is there
    with its shape. A user's model, or a checkpoint that kept no shape, is told apart here rather than by
    load_state_dict's list of every tensor."""
    held = {name: tuple(tensor.shape) for name, tensor in state.items()}
    differing = [name for name in shapes if name in held and held[name] != shapes[name]]
    missing, extra = [name for name in shapes if name not in held], [name for name in held if name not in shapes]
    if not (differing or missing or extra):
        return None

    def size(shape: tuple) -> str:
        return "x".join(map(str, shape)) or "a scalar"
    found = [f"{len(differing)} of its {len(held)} tensors differ in shape ("
             + "; ".join(f"{name}: {size(held[name])} there, {size(shapes[name])} here" for name in differing[:3])
             + ("; ..." if len(differing) > 3 else "") + ")"] if differing else []
    found += [f"this model has {len(missing)} tensor(s) it lacks ({', '.join(missing[:3])})"] if missing else []
    found += [f"it has {len(extra)} tensor(s) this model lacks ({', '.join(extra[:3])})"] if extra else []
    return (f"{holder} whose weights do not fit this job's: {', and '.join(found)}. A checkpoint continues only the "
            f"model that wrote it. Relaunch with the flags that shaped it (--gpt-size, --gpt-layers, --gpt-heads, "
            f"--gpt-width, --context, --image-size, or your model function's own settings; its run's params in MLflow "
            f"and its config.toml list them), or drop --resume to start afresh.")
