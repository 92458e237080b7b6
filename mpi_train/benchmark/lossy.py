"""The lossy options the advisor lists apart and never recommends: each compression and each method that averages
models, with its predicted step and the accuracy cost the project measured for it."""

from __future__ import annotations

from .. import netmodel
from ..advice.search import StepModel
from ..config import TrainConfig
from ..sync import PARAMETERS, SYNC_METHODS, backend_error, build_method, every_label, split_label
from ..sync.averaging import STREAMED, STREAMED_COMPRESSIONS
from ..sync.base import AccuracyCost

SOURCE = "docs/results.md"
# (model, compression) -> the accuracy cost measured of a gradient method's compression; a method that averages
# models keeps its own (its class's accuracy_costs)
ACCURACY_COST = {
    ("vgg11", "fp16"): AccuracyCost(+0.62, "bucketed+fp16, CIFAR-10, one epoch, np 4, batch 256",
                                    f"{SOURCE}#what-each-lossy-option-costs-in-accuracy"),
    ("vgg11", "powersgd"): AccuracyCost(-1.78, "bucketed+powersgd rank 2 from step 101, CIFAR-10, one epoch, np 4",
                                        f"{SOURCE}#what-each-lossy-option-costs-in-accuracy"),
    ("mnist_cnn", "fp16"): AccuracyCost(+0.05, "bucketed+fp16, MNIST, one epoch, np 4, batch 256",
                                        f"{SOURCE}#what-each-lossy-option-costs-in-accuracy"),
    ("mnist_cnn", "powersgd"): AccuracyCost(+0.03, "bucketed+powersgd rank 2 from step 11, MNIST, one epoch, np 4",
                                            f"{SOURCE}#what-each-lossy-option-costs-in-accuracy"),
}


def option_of(text: str) -> str:
    """What a lossy label is listed by: its compression, or a model-averaging method (with its compression, if
    any)."""
    name, compression = split_label(text)
    method = SYNC_METHODS[name]
    if method.traits.averages == PARAMETERS:
        return name if compression == "none" else text
    return method.traits.compression_name(compression)


def configured(text: str):
    """The method a label names, as a job with its defaults configures it (`bucketed+fp16`, `localsgd+fp16
    --overlap`, `localsgd+fp16 --overlap --fragments 4`)."""
    streamed = next((suffix for suffix in STREAMED if text.endswith(suffix)), "")  # (no suffix ends another)
    name, compression = split_label(text.removesuffix(streamed))
    return build_method(name, TrainConfig(sync=name, compression=compression,
                                                      **STREAMED.get(streamed, {})))


def accuracy_cost(model_name: str, text: str) -> AccuracyCost | None:
    """The accuracy cost measured for a lossy label on this model: a model-averaging method's own (its class), else
    its compression's (ACCURACY_COST)."""
    name, compression = split_label(text)
    method = SYNC_METHODS[name]
    if method.traits.averages == PARAMETERS:
        return method.traits.accuracy_costs.get((model_name, compression))
    return ACCURACY_COST.get((model_name, method.traits.compression_name(compression)))


def measured_settings(method_class, cost: AccuracyCost | None) -> dict:
    """The settings a model-averaging option's accuracy cost was measured with (`--host-period 1`, `--period 4`):
    the option is priced and flagged as measured, not at the defaults. A compression's cost keeps the defaults."""
    return dict(cost.settings) if cost and method_class.traits.averages == PARAMETERS else {}


def option_flags(name: str, compression: str, settings: dict) -> list[str]:
    """An option as a job's flags: its method, its compression unless none, and the TrainConfig settings its
    accuracy was measured with (`--sync localsgd --compression fp16 --host-period 1`)."""
    return (["--sync", name] + (["--compression", compression] if compression != "none" else [])
            + [word for field, value in settings.items() for word in ("--" + field.replace("_", "-"), str(value))])


def lossy_options(model_name: str, params, model: StepModel, backend: str) -> tuple[list[dict], list[tuple]]:
    """Every lossy label with its predicted step (the wire only: a compressor's CPU work is left out) and its
    measured accuracy cost; and those the backend cannot run, with the reason."""
    rows, refused = [], []
    for text in every_label():
        name, compression = split_label(text)
        method_class = SYNC_METHODS[name]
        traits = method_class.traits
        if compression == "none" and not traits.fixed_compression and traits.averages != PARAMETERS:
            continue
        why = backend_error(name, backend)
        if why:
            refused.append((text, why))
            continue
        cost = accuracy_cost(model_name, text)
        measured = measured_settings(method_class, cost)
        method = build_method(name, TrainConfig(sync=name, compression=compression, **measured))
        prediction = netmodel.predict(method, model.tensor_bytes, model.layout, model.network, label=text,
                                      ratio=netmodel.wire_ratio(method, params),
                                      later=netmodel.later_share(method, params), backward_s=model.backward_s,
                                      backward=model.backward, units=model.units)
        if prediction is None:
            continue
        rows.append({"label": text, "option": option_of(text),
                     "flags": option_flags(name, compression, measured),
                     "predicted_step_s": model.baseline_step_s + prediction.sync_s,
                     "accuracy_points": cost.points if cost else None,
                     "accuracy_measured": f"{cost.measured}; {cost.source}" if cost else None})
        if method_class.traits.averages == PARAMETERS and compression in STREAMED_COMPRESSIONS:
            rows.extend(overlapped_option(model_name, params, model, text, streamed) for streamed in STREAMED)
    return sorted(rows, key=lambda row: row["predicted_step_s"]), refused


def overlapped_option(model_name: str, params, model: StepModel, text: str, streamed: str) -> dict:
    """A model-averaging label with its averages in the background (`streamed`: --overlap, and in fragments): free
    while each fits in the local steps until the next, else what outlasts them; its accuracy cost as its class
    lists it (key: the compression and `streamed`), if measured."""
    name, compression = split_label(text)
    method_class = SYNC_METHODS[name]
    cost = method_class.traits.accuracy_costs.get((model_name, compression + streamed))
    measured = measured_settings(method_class, cost)
    method = build_method(name, TrainConfig(sync=name, compression=compression, **STREAMED[streamed],
                                                  **measured))
    prediction = netmodel.predict(method, model.tensor_bytes, model.layout, model.network, label=text,
                                  ratio=netmodel.wire_ratio(method, params),
                                  later=netmodel.later_share(method, params), backward_s=model.backward_s,
                                  backward=model.backward, compute_s=model.compute_s, units=model.units)
    return {"label": text + streamed, "option": option_of(text) + streamed,
            "flags": option_flags(name, compression, measured) + streamed.split(),
            "predicted_step_s": model.baseline_step_s + prediction.sync_s,
            "accuracy_points": cost.points if cost else None,
            "accuracy_measured": f"{cost.measured}; {cost.source}" if cost else None}
