"""The config dataclass and the CLI built from it (one process, no MPI launch)."""

import dataclasses
import re

import pytest
import torch

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


@pytest.mark.parametrize("world_size,accumulate", [(3, 1), (2, 3), (3, 3), (300, 1)])
def test_reshard_advice_for_a_batch_that_does_not_split_is_advice_the_checks_accept(world_size, accumulate):
    """--reshard keeps the checkpoint's global batch: each rank count, --accumulate and fresh --batch-size the
    message suggests passes the same check (a multiple of the ranks alone would be refused at resume)."""
    job = {"dataset": "synthetic", "batch_size": 256, "accumulate": accumulate, "checkpoint_dir": "ck"}
    with pytest.raises(UserError) as error:
        TrainConfig(**job, resume="auto", reshard=True).validate(world_size)
    message = " ".join(str(error.value).split())
    assert "--batch-size 256" in message and "drop --resume and --reshard" in message
    ranks = [int(n) for n in re.findall(r"-np (\d+)", message)]
    assert ranks == {(3, 1): [2, 4], (2, 3): [], (3, 3): [], (300, 1): [256]}[world_size, accumulate]
    for count in ranks:
        TrainConfig(**job, resume="auto", reshard=True).validate(count)
    share = f"an --accumulate that divides each rank's {256 // world_size} samples"
    assert (share in message) == (not 256 % world_size)  # offered where the ranks split it and K does not
    if share in message:
        for k in (k for k in range(1, 257) if not 256 // world_size % k):
            TrainConfig(**{**job, "accumulate": k}, resume="auto", reshard=True).validate(world_size)
    fresh = re.search(r"multiple of \d+ \(e\.g\. (\d+) or (\d+)\) in another --checkpoint-dir", message)
    assert len(set(fresh.groups())) == 2
    for batch_size in map(int, fresh.groups()):
        TrainConfig(**{**job, "batch_size": batch_size, "checkpoint_dir": "ck2"}).validate(world_size)


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


# A job file (--config): the same keys as an experiment file's [train] table, logged by every tracked run -----------

def job_options(text: str) -> dict:
    from mpi_train.config import parse_job_file

    return parse_job_file(text, "job.toml")


def test_a_job_file_sets_options_by_name_an_integer_standing_for_a_float():
    options = job_options('sync = "bucketed"\nbucket_mb = 4\noverlap = false\nmodel = "gpt"  # a comment\n')
    assert options == {"sync": "bucketed", "bucket_mb": 4.0, "overlap": False, "model": "gpt"}
    assert isinstance(options["bucket_mb"], float)


def test_an_unknown_key_is_refused_naming_the_nearest_one():
    with pytest.raises(UserError) as refused:
        job_options('sync = "localsgd"\n\noverlapp = true\n')
    assert str(refused.value).startswith("job.toml, line 3, key overlapp: unknown key 'overlapp'. Did you mean "
                                         "'overlap'?")
    assert "train --help" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("text,message", [
    ('seed = 1\nbatch_size = "256"\n', "job.toml, line 2, key batch_size: must be an integer, got a string ('256')."),
    ("lr = true\n", "job.toml, line 1, key lr: must be a number, got a boolean (True)."),
    ("overlap = 1\n", "job.toml, line 1, key overlap: must be true or false, got an integer (1)."),
    ("[sync]\nname = 1\n", "job.toml, line 1, key sync: must be a string, got a table."),
    ('sync = "bucketd"\n', "job.toml, line 1, key sync: 'bucketd' is not one of "),
])
def test_a_wrong_type_or_value_is_refused_naming_the_key(text, message):
    with pytest.raises(UserError) as refused:
        job_options(text)
    assert str(refused.value).startswith(message)
    if "bucketd" in text:  # a choice: the flag's own, --sync auto included, and the nearest
        assert "auto" in str(refused.value) and str(refused.value).endswith("Did you mean 'bucketed'?")


def test_a_job_file_that_is_not_toml_names_its_line():
    with pytest.raises(UserError, match=r"^job\.toml, line 2: this is not valid TOML: .*https://toml\.io"):
        job_options("seed = 1\nsync = bucketed\n")


def test_an_unreadable_job_file_is_refused_with_the_reason(tmp_path):
    from mpi_train.config import read_job_file

    with pytest.raises(UserError, match=r"cannot read the job file .*missing\.toml \(--config\): No such file"):
        read_job_file(str(tmp_path / "missing.toml"))
    (tmp_path / "latin1.toml").write_bytes(b'run_name = "caf\xe9"\n')
    with pytest.raises(UserError, match="it is not UTF-8 text"):
        read_job_file(str(tmp_path / "latin1.toml"))


def test_the_logged_job_file_reads_back_to_the_same_job_but_its_outputs_and_whereabouts():
    from mpi_train.config import JOB_FILE_LEAVES_OUT, job_file

    config = TrainConfig(sync="bucketed", bucket_mb=0.1 + 0.2, dataset="synthetic", lr=1 / 3, seed=7, overlap=False,
                         dropout=0.0, run_name='a "quoted" \\ name\x7f é', summary_json="out.json",
                         checkpoint_dir="ckpt", checkpoint_every=2, resume="auto",
                         tracking_uri="http://alice:pw@host:5000", master_addr="10.0.0.1", timeline_dir="t")
    text = job_file(config, 4)
    assert "mpirun -np 4 python -m mpi_train --config config.toml" in text and "pw" not in text
    read = TrainConfig(**job_options(text))
    assert read.bucket_mb == 0.1 + 0.2 and read.lr == 1 / 3 and read.run_name == config.run_name  # to the last bit
    # the model and its optimizer's settings as the job resolved them; paths and the rendezvous left out
    assert (read.model, read.optimizer, read.momentum, read.warmup_steps) == ("mnist_cnn", "sgd", 0.9, 40)
    for name, value in dataclasses.asdict(TrainConfig()).items():
        if name in JOB_FILE_LEAVES_OUT:
            assert getattr(read, name) == value, name
        elif name not in ("model", "optimizer", "momentum", "weight_decay", "warmup_steps"):
            assert getattr(read, name) == getattr(config, name), name
    assert set(JOB_FILE_LEAVES_OUT) == {"summary_json", "timeline_dir", "checkpoint_dir", "checkpoint_every", "resume",
                                        "reshard", "advice", "tracking_uri", "master_addr"}


# The job file on the command line: flags > file > environment > defaults --------------------------------------------

@pytest.fixture
def job_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('sync = "ring"\nbatch_size = 128\nseed = 7\ntracking_uri = "http://file:5000"\n')
    return str(path)


def test_flags_override_the_job_file_which_overrides_the_environment_and_the_defaults(job_file, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://environment:5000")
    config = parse_config(["--config", job_file, "--seed", "3"])
    assert (config.sync, config.batch_size) == ("ring", 128)  # the file's, over the defaults
    assert config.seed == 3  # the flag's, over the file's
    assert config.tracking_uri == "http://file:5000"  # the file's, over the environment's
    assert config.lr is TrainConfig.lr and config.epochs == TrainConfig.epochs  # neither says: the defaults
    flagged = parse_config(["--tracking-uri", "http://flag:5000", "--config", job_file])  # wherever the flag is
    assert flagged.tracking_uri == "http://flag:5000" and flagged.seed == 7
    assert parse_config(["--sync", "ring"]).tracking_uri == "http://environment:5000"  # no file: the environment


def test_a_flag_first_runs_train_with_the_job_file():
    from mpi_train.cli import split

    assert split(["--config", "job.toml"]) == ("train", ["--config", "job.toml"])


def test_a_mistake_in_the_job_file_is_refused_before_anything_starts(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("batch_sise = 128\n")
    with pytest.raises(UserError, match=r"bad\.toml, line 1, key batch_sise: unknown key .* Did you mean 'batch_size'"):
        parse_config(["--config", str(bad)])
    with pytest.raises(UserError, match="cannot read the job file"):
        parse_config(["--config", str(tmp_path / "none.toml")])
