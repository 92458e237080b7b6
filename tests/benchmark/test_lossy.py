"""The advisor's lossy options: listed apart, each with the accuracy cost measured where it was, and priced and
flagged as it was measured."""

import re

from mpi_train import netmodel
from mpi_train.advice.search import StepModel
from mpi_train.benchmark.advice_report import lossy_table
from mpi_train.benchmark.lossy import configured, lossy_options
from mpi_train.config import TrainConfig
from mpi_train.models import build_model
from mpi_train.sync import build_method


def test_lossy_options_are_listed_apart_with_the_accuracy_cost_measured_where_it_was():
    model = build_model("vgg11")
    sizes = netmodel.tensor_sizes(model)
    step = StepModel(tuple(sizes), netmodel.Layout(4, 2), netmodel.Network(netmodel.LOOPBACK_LINK,
                                                                            netmodel.nominal_link("100mbit")),
                     netmodel.ASSUMED_BACKWARD, 1.0, 1.0)
    rows, refused = lossy_options("vgg11", list(model.parameters()), step, "gloo")
    options = {row["label"]: row for row in rows}
    assert {"flat_fp16", "ddp_fp16", "bucketed+bf16", "ring+powersgd", "localsgd", "diloco"} <= set(options)
    assert not {"flat", "ddp", "bucketed", "ring"} & set(options)  # the lossless ones are the search's
    assert [name for name, _ in refused] == ["ddp_powersgd"]  # NCCL only
    assert options["bucketed+fp16"]["accuracy_points"] == 0.62 and options["ddp_fp16"]["accuracy_points"] == 0.62
    assert options["flat+powersgd"]["accuracy_points"] == -1.78
    assert options["localsgd"]["accuracy_points"] == -4.54 and options["diloco"]["accuracy_points"] == -14.57
    assert options["bucketed+bf16"]["accuracy_points"] is None and options["diloco+bf16"]["accuracy_points"] is None
    assert options["flat+powersgd"]["predicted_step_s"] < options["flat_fp16"]["predicted_step_s"]  # 0.24 MB
    lines = lossy_table(rows)
    by_option = {line.split()[0]: line for line in lines[1:] if not line.startswith("  [")}
    sources = {int(number): text for number, text in (re.match(r"  \[(\d+)\] (.*)", line).groups()
                                                      for line in lines if line.startswith("  ["))}
    for option, points, measured in (("fp16", "+0.62", "bucketed+fp16, CIFAR-10"),
                                     ("powersgd", "-1.78", "bucketed+powersgd rank 2"),
                                     ("localsgd", "-4.54", "localsgd --period 8")):
        number = int(re.search(rf"{re.escape(points)} points \[(\d+)\]$", by_option[option]).group(1))
        assert sources[number].startswith(measured) and "docs/results.md#" in sources[number]  # numbered, below
    assert by_option["bf16"].endswith("not measured")
    # each averaging method's lossless or cast options again with their averages in the background: never slower,
    # listed with the accuracy cost measured for it, where it was
    overlapped = options["localsgd+fp16 --overlap"]
    assert overlapped["flags"][-1] == "--overlap" and overlapped["accuracy_points"] == -3.03
    fragmented = options["localsgd+fp16 --overlap --fragments 4"]  # a quarter of the model every 2 steps
    assert fragmented["flags"][-3:] == ["--overlap", "--fragments", "4"] and fragmented["accuracy_points"] == -1.33
    assert configured(fragmented["label"]).fragments == 4 and configured(fragmented["label"]).overlap
    assert options["diloco+fp16 --overlap"]["accuracy_points"] is None
    assert overlapped["predicted_step_s"] <= options["localsgd+fp16"]["predicted_step_s"]
    assert "localsgd+powersgd --overlap" not in options  # PowerSGD's rounds do not stream
    # priced and flagged as their accuracy was measured: a host's ranks averaged every step, PowerSGD at period 4
    assert fragmented["flags"][-5:-3] == ["--host-period", "1"] and "--host-period" not in options["localsgd"]["flags"]
    assert options["localsgd+powersgd"]["flags"][-2:] == ["--period", "4"]
    plain = build_method("localsgd", TrainConfig(sync="localsgd", compression="powersgd"))
    assert options["localsgd+powersgd"]["predicted_step_s"] > 1.0 + netmodel.predict(
        plain, sizes, step.layout, step.network, ratio=netmodel.wire_ratio(plain, list(model.parameters()))).sync_s

