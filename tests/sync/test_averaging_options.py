"""The averaging methods' options (AveragingOptions, and diloco's OuterStepOptions): their defaults, their checks, and
how TrainConfig and the methods read them from one place."""

import dataclasses

import pytest

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.sync import build_method, tuned_by
from mpi_train.sync.averaging import averaging_options
from mpi_train.sync.averaging_options import DEFAULT_PERIOD, AveragingOptions
from mpi_train.sync.bucketed import BucketOptions
from mpi_train.sync.compression.powersgd import PowerSGDOptions
from mpi_train.sync.diloco import DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM, OuterStepOptions
from mpi_train.sync.flag_fields import option_names


def test_unset_flags_take_the_methods_defaults_and_given_ones_win():
    assert AveragingOptions().averaging_settings() == {"period": DEFAULT_PERIOD, "local_start_step": 0,
                                                       "host_period": 0, "local_momentum": "keep", "overlap": False,
                                                       "fragments": 1}
    assert AveragingOptions(period=4, fragments=2).averaging_settings()["fragments"] == 2
    assert OuterStepOptions().outer_step() == (DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM)
    assert OuterStepOptions(outer_lr=1.0, outer_momentum=0.0).outer_step() == (1.0, 0.0)
    config = TrainConfig(sync="localsgd", period=4, local_momentum="reset", timeout=60.0)
    assert averaging_options(config) == {"period": 4, "local_start_step": 0, "host_period": 0, "momentum": "reset",
                                         "overlap": False, "fragments": 1, "timeout_s": 60.0}


def test_the_configured_method_runs_the_options_given():
    method = build_method("diloco", TrainConfig(sync="diloco", period=6, fragments=3, outer_lr=0.5))
    assert (method.period, method.fragments, method.outer_lr, method.outer_momentum) == (6, 3, 0.5,
                                                                                         DEFAULT_OUTER_MOMENTUM)
    assert build_method("localsgd", TrainConfig(sync="localsgd")).period == DEFAULT_PERIOD


@pytest.mark.parametrize("options,compression,message", [
    (AveragingOptions(period=0), "none", r"--period must be at least 1 \(average every step\), got 0\."),
    (AveragingOptions(local_start_step=-1), "none", r"--local-start-step must not be negative, got -1\."),
    (AveragingOptions(host_period=8), "none", r"--host-period 8 must be shorter than --period 8"),
    (AveragingOptions(period=6, fragments=4), "none", r"--fragments 4 must divide --period 6.*one of 1, 2, 3, 6"),
    (AveragingOptions(fragments=0), "none", r"--fragments must be at least 1"),
    (AveragingOptions(overlap=True, local_momentum="average"), "none", r"--local-momentum average with --overlap"),
    (AveragingOptions(fragments=2), "powersgd", r"--compression powersgd with --fragments 2: .*fp16, bf16 or none"),
])
def test_values_no_average_can_run_are_refused_saying_why(options, compression, message):
    with pytest.raises(UserError, match=message):
        options.check_averaging(compression)


def test_values_in_range_pass_each_options_check():
    AveragingOptions(period=16, host_period=4, fragments=4, overlap=True).check_averaging("bf16")
    AveragingOptions(local_momentum="reset").check_averaging("powersgd")
    OuterStepOptions(outer_lr=0.5, outer_momentum=0.0).check_outer_step()
    BucketOptions(bucket_mb=0.5).check_buckets()
    PowerSGDOptions(powersgd_rank=1, powersgd_start_step=0).check_powersgd()
    for refused, message in [(OuterStepOptions(outer_lr=0.0).check_outer_step, "--outer-lr must be positive"),
                             (OuterStepOptions(outer_momentum=1.0).check_outer_step, r"--outer-momentum must be in"),
                             (BucketOptions(bucket_mb=-1.0).check_buckets, "--bucket-mb must be positive"),
                             (PowerSGDOptions(powersgd_rank=0).check_powersgd, "--powersgd-rank must be positive"),
                             (PowerSGDOptions(powersgd_start_step=-1).check_powersgd,
                              "--powersgd-start-step must not be negative")]:
        with pytest.raises(UserError, match=message):
            refused()


def test_the_methods_that_read_an_option_are_those_whose_option_class_declares_it():
    assert all(tuned_by(name) == ["localsgd", "diloco"] for name in option_names(AveragingOptions))
    assert all(tuned_by(name) == ["diloco"] for name in option_names(OuterStepOptions))
    assert option_names(BucketOptions) == ("bucket_mb",) and tuned_by("bucket_mb") == ["bucketed", "zero"]
    assert not any(tuned_by(name) for name in option_names(PowerSGDOptions))  # the compressor's, not a method's


def test_train_config_composes_the_options_in_the_order_help_lists_them():
    names = [one.name for one in dataclasses.fields(TrainConfig)]
    assert names[:15] == ["sync", "advice", "bucket_mb", "compression", "powersgd_rank", "powersgd_start_step",
                          "period", "local_start_step", "host_period", "local_momentum", "overlap", "fragments",
                          "outer_lr", "outer_momentum", "dataset"]
    options = {*option_names(AveragingOptions), *option_names(OuterStepOptions), *option_names(BucketOptions),
               *option_names(PowerSGDOptions)}
    assert not options & set(TrainConfig.__annotations__)  # each option declared once, in its method's file
    assert TrainConfig().bucket_size_mb == 25.0 and TrainConfig(period=3).period == 3
