"""TrainConfig: the defaults a job resolves, and what reaches the sync method (one process, no MPI launch)."""

from mpi_train.commands.train import parse_config
from mpi_train.config import TrainConfig
from mpi_train.sync import build_method


def test_model_defaults_follow_the_dataset():
    assert TrainConfig(dataset="cifar10").model_name == "vgg11"
    assert TrainConfig(dataset="mnist").model_name == "mnist_cnn"
    assert TrainConfig(dataset="mnist", model="vgg11").model_name == "vgg11"


def test_bucket_size_reaches_the_bucketed_method():
    config = parse_config(["--sync", "bucketed", "--bucket-mb", "0.5"])
    assert build_method(config.sync, config).bucket_bytes == 2**19
    assert build_method("bucketed", TrainConfig()).bucket_bytes == 25 * 2**20  # DDP's default


def test_valid_config_passes_and_splits_the_batch():
    config = TrainConfig(batch_size=256)
    config.validate(world_size=4)
    assert config.per_rank(4) == 64
