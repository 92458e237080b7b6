"""TrainConfig's fields as flags: training's parser, and the model flags of the tools that build a model without
training it (one process, no MPI launch)."""

import dataclasses

import pytest
import torch

from mpi_train.commands.train import build_parser, parse_config, refusal
from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
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


def test_quiet_parser_prints_nothing_and_what_it_would_have_said_is_kept_for_a_rank_refused_alone(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--sync", "nope"], quiet=True)
    assert capsys.readouterr() == ("", "")
    said = refusal(["--epochs", "abc"])  # said by a rank whose flags alone were refused (commands/train.py)
    assert said.startswith("argument --epochs: invalid int value: 'abc'. `python -m mpi_train train --help` lists")
    assert capsys.readouterr() == ("", "")


# --- the model flags of the commands that build a model without training it (bench, advise, predict, gpu-check) --

def _tool_parsers():
    from mpi_train.analysis import predict
    from mpi_train.commands import advise, bench, gpu_check

    return {"bench": bench.build_parser(quiet=True).parse_args, "advise": advise.build_parser(quiet=True).parse_args,
            "predict": predict.build_parser().parse_args,
            "gpu-check": lambda argv: gpu_check.parse_args(argv, quiet=True)}


@pytest.mark.parametrize("command", ["bench", "advise", "predict", "gpu-check"])
def test_every_tool_names_a_model_as_training_does(command, tmp_path, monkeypatch):
    from mpi_train.config import model_config

    (tmp_path / "tool_users_model.py").write_text(
        "from torch import nn\n\n"
        "def build(num_classes, input_shape):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], "
        "num_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    parse = _tool_parsers()[command]
    assert model_config(parse([])).model_name == "vgg11"  # each tool's default, as before
    gpt = model_config(parse(["--model", "gpt", "--gpt-size", "small", "--context", "64"]))
    assert gpt.input_shape == (64,) and gpt.gpt_shape.width == 384 and gpt.language_model
    assert model_config(parse(["--model", "resnet18"])).input_shape == (3, 32, 32)
    users = model_config(parse(["--model", "tool_users_model:build"]))
    assert users.make_model()(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(UserError) as unknown:  # the registry's error, as training gives it
        model_config(parse(["--model", "resnet19"]))
    assert str(unknown.value) == str(pytest.raises(UserError, TrainConfig(model="resnet19").validate, 4).value)
    with pytest.raises(UserError, match="--gpt-width 100 must split evenly across --gpt-heads 6"):
        model_config(parse(["--model", "gpt", "--gpt-size", "small", "--gpt-width", "100"]))
    from mpi_train.models import check, resolve

    resolve.cache_clear()  # the user's module lives in this test's folder only
    check.cache_clear()


def test_a_tools_dataset_shapes_the_model_and_is_refused_where_training_refuses_it():
    from mpi_train.commands import bench
    from mpi_train.config import model_config, model_flag_words

    parse = bench.build_parser(quiet=True).parse_args
    assert model_config(parse(["--model", "mnist_cnn", "--dataset", "mnist"])).input_shape == (1, 28, 28)
    with pytest.raises(UserError, match="takes tokens, and cifar10 is images"):
        model_config(parse(["--model", "gpt", "--dataset", "cifar10"]))
    with pytest.raises(UserError, match="--dataset text is bytes for a language model"):
        model_config(parse(["--model", "resnet18", "--dataset", "text"]))
    # the advice's command line repeats the model's flags, only those given
    assert model_flag_words(parse(["--model", "gpt", "--gpt-size", "small", "--gpt-layers", "2"])) == [
        "--model", "gpt", "--gpt-size", "small", "--gpt-layers", "2"]


def test_a_tools_synthetic_batch_is_what_its_model_takes():
    from mpi_train.config import model_config
    from mpi_train.data import synthetic_batch

    parse = _tool_parsers()["bench"]
    gpt = model_config(parse(["--model", "gpt", "--gpt-layers", "1", "--gpt-width", "32", "--context", "16"]))
    tokens, targets = synthetic_batch(gpt, 3)
    assert tokens.shape == (3, 16) and targets.shape == (48,) and tokens.dtype == torch.int64
    assert torch.equal(tokens[:, 1:].reshape(-1), targets.view(3, 16)[:, :-1].reshape(-1))  # the next bytes
    loss = torch.nn.functional.cross_entropy(gpt.make_model()(tokens), targets)
    assert 4 < loss.item() < 7  # about ln 256 at the start
    images, labels = synthetic_batch(model_config(parse(["--model", "resnet18"])), 4)
    assert images.shape == (4, 3, 32, 32) and labels.shape == (4,)
