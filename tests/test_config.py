"""The config dataclass and the CLI built from it (one process, no MPI launch)."""

import dataclasses

import pytest

from mpi_train.commands.train import build_parser, parse_config
from mpi_train.config import TrainConfig
from mpi_train.errors import UserError, format_error
from mpi_train.sync import SYNC_METHODS


def test_every_config_field_is_a_flag_with_help():
    parser = build_parser()
    flags = {a.dest: a for a in parser._actions}
    for field in dataclasses.fields(TrainConfig):
        assert field.name in flags, field.name
        assert flags[field.name].help


def test_cli_overrides_defaults_and_keeps_the_rest():
    config = parse_config(["--sync", "gather_scatter", "--batch-size", "128", "--max-steps", "5"])
    assert (config.sync, config.batch_size, config.max_steps) == ("gather_scatter", 128, 5)
    assert config.lr == TrainConfig.lr and config.seed == TrainConfig.seed


def test_sync_choices_come_from_the_registry_and_model_names_from_the_models_one():
    actions = {a.dest: a for a in build_parser()._actions}
    assert tuple(actions["sync"].choices) == (*SYNC_METHODS, "auto")  # auto: the advice's pick (tests/advice/)
    assert actions["model"].choices is None  # any torchvision name or MODULE:CALLABLE: models/ resolves them
    assert "resnet18" in actions["model"].help and "MODULE:CALLABLE" in actions["model"].help


@pytest.mark.parametrize("flag,value", [("--sync", "ring_of_fire"), ("--backend", "mpi"), ("--dataset", "imagenet")])
def test_unknown_names_are_rejected_listing_the_choices(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config([flag, value])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_quiet_parser_prints_nothing(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--sync", "nope"], quiet=True)
    assert capsys.readouterr() == ("", "")


def test_model_defaults_follow_the_dataset():
    assert TrainConfig(dataset="cifar10").model_name == "vgg11"
    assert TrainConfig(dataset="mnist").model_name == "mnist_cnn"
    assert TrainConfig(dataset="mnist", model="vgg11").model_name == "vgg11"


def test_indivisible_batch_names_values_and_fix():
    with pytest.raises(UserError) as error:
        TrainConfig(batch_size=250).validate(world_size=4)
    message = str(error.value)
    assert "--batch-size 250" in message and "4 ranks" in message and "248" in message and "252" in message


@pytest.mark.parametrize("field,value", [("batch_size", 0), ("epochs", -1), ("lr", 0.0), ("max_steps", 0),
                                         ("log_every", 0), ("threads", 0), ("timeout", -5.0), ("momentum", -0.1),
                                         ("bucket_mb", 0.0)])
def test_zero_or_negative_numbers_are_rejected(field, value):
    with pytest.raises(UserError) as error:
        TrainConfig(**{field: value}).validate(world_size=1)
    assert str(value) in str(error.value)


def test_bucket_size_reaches_the_bucketed_method():
    config = parse_config(["--sync", "bucketed", "--bucket-mb", "0.5"])
    assert SYNC_METHODS[config.sync].from_config(config).bucket_bytes == 2**19
    assert SYNC_METHODS["bucketed"].from_config(TrainConfig()).bucket_bytes == 25 * 2**20  # DDP's default


def test_valid_config_passes_and_splits_the_batch():
    config = TrainConfig(batch_size=256)
    config.validate(world_size=4)
    assert config.per_rank(4) == 64


def test_errors_print_as_one_paragraph():
    text = format_error("x " * 200)
    assert text.startswith("mpi_train: error:") and "\n\n" not in text


@pytest.mark.parametrize("dataset,model", [("cifar10", "mnist_cnn"), ("mnist", "vgg11")])
def test_a_model_that_cannot_take_the_data_sets_images_is_refused(dataset, model):
    with pytest.raises(UserError, match=f"--model {model} takes images of .* and {dataset}'s are"):
        TrainConfig(dataset=dataset, model=model).validate(1)
    TrainConfig(dataset="synthetic", model=model).validate(1)  # synthetic images take the model's shape


def test_the_data_path_flags_are_checked():
    assert TrainConfig().loader == "auto"
    with pytest.raises(UserError, match="--loader-workers must not be negative"):
        TrainConfig(loader="dataloader", loader_workers=-1).validate(1)
