"""The DataLoader path and a damaged image (mpi_train/data/loaders.py): named before the first step, checked once per
version of the files, and named by the batch that meets one that went bad later, in one process."""

import os

import numpy as np
import pytest
import torch
from disk_formats import damage_an_image, write_cifar10_folders

from mpi_train.cluster import Cluster
from mpi_train.config import TrainConfig
from mpi_train.data import cache, load_datasets, make_loaders
from mpi_train.errors import UserError

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cluster():
    return Cluster.from_mpi()


def dataloader_path(data, cluster, workers: int = 0):
    config = TrainConfig(data_dir=str(data), batch_size=8, loader="dataloader", loader_workers=workers)
    return make_loaders(*load_datasets(config, cluster), config, cluster, CPU)


def test_a_damaged_image_is_named_before_the_first_step(tmp_path, cluster, capsys):
    data = write_cifar10_folders(tmp_path / "data", train=20, test=10)
    damaged = damage_an_image(data)
    with pytest.raises(UserError) as error:
        dataloader_path(data, cluster)
    message = str(error.value)
    assert message.startswith(f"cannot read cifar10: the image {damaged} cannot be decoded (no image format")
    assert "Remove it, or replace it with a good copy" in message
    damaged.unlink()  # as the message says
    loaders = dataloader_path(data, cluster)
    assert "checked that the 19 images under" in capsys.readouterr().out
    assert sum(len(labels) for _, labels in loaders.train) == 19
    verdict = cache.cache_folder(data) / "cifar10-folder-train.checked"
    assert verdict.read_text() == cache.fingerprint(cache.source_files(load_datasets(
        TrainConfig(data_dir=str(data)), cluster)[0]))
    dataloader_path(data, cluster)
    assert "checked" not in capsys.readouterr().out  # the same files: not decoded again


@pytest.mark.parametrize("workers", [0, 2])
def test_an_image_damaged_after_the_check_is_named_by_its_batch(tmp_path, cluster, workers):
    data = write_cifar10_folders(tmp_path / "data", train=16, test=10)
    dataloader_path(data, cluster)  # checked: every image decodes
    victim = sorted((data / "train").rglob("*.png"))[5]
    status = victim.stat()  # the same size and time: the verdict stands, and only the batch can tell
    victim.write_bytes(np.random.default_rng(3).integers(0, 256, status.st_size, dtype=np.uint8).tobytes())
    os.utime(victim, ns=(status.st_atime_ns, status.st_mtime_ns))
    loaders = dataloader_path(data, cluster, workers)
    with pytest.raises(UserError) as error:
        for _ in loaders.train:
            pass
    message, collective = str(error.value), error.value.collective
    del error  # its traceback holds the workers: they end with the test, not in a garbage collection later
    assert not collective  # met by this rank alone: the job is ended, as for any one rank's fault
    assert message.startswith(f"the image {victim} cannot be decoded (no image format recognised")
    assert "Traceback" not in message
