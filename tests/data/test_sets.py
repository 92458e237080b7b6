"""The data sets as torchvision reads them, and their shards, in one process (MPI as a singleton: world size 1)."""

import socket
from pathlib import Path

import pytest
import torch
from disk_formats import write_cifar10_batches, write_cifar10_folders, write_mnist
from torch.utils.data import DistributedSampler
from torchvision import datasets
from torchvision.datasets import cifar

from mpi_train.cluster import Cluster
from mpi_train.config import TrainConfig
from mpi_train.data import SyntheticImages, load_datasets, make_loaders
from mpi_train.errors import UserError


@pytest.fixture(scope="module")
def cluster():
    return Cluster.from_mpi()


def test_synthetic_data_is_deterministic_and_class_dependent():
    a, b = SyntheticImages(200, (1, 28, 28), True), SyntheticImages(200, (1, 28, 28), True)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    class_means = torch.stack([a.images[a.labels == c].mean(0) for c in range(10)])
    assert torch.cdist(class_means.flatten(1), class_means.flatten(1)).max() > 5  # classes look different
    test = SyntheticImages(50, (1, 28, 28), False)
    assert not torch.equal(test.images[:50], a.images[:50])  # test split is not the training split


def test_synthetic_shape_follows_the_model(cluster):
    train, test = load_datasets(TrainConfig(dataset="synthetic", model="vgg11", synthetic_size=64), cluster)
    assert train[0][0].shape == (3, 32, 32) and len(train) == 64 and len(test) == 16


def test_mnist_idx_files_are_read_by_torchvision(tmp_path, cluster):
    write_mnist(tmp_path, train=40, test=10)
    train, test = load_datasets(TrainConfig(dataset="mnist", data_dir=str(tmp_path)), cluster)
    assert isinstance(train, datasets.MNIST) and (len(train), len(test)) == (40, 10)
    image, label = train[7]
    assert image.shape == (1, 28, 28) and label == 7


def test_cifar10_image_folders_are_read_with_augmentation(tmp_path, cluster):
    write_cifar10_folders(tmp_path, train=30, test=10)
    train, test = load_datasets(TrainConfig(dataset="cifar10", data_dir=str(tmp_path)), cluster)
    assert isinstance(train, datasets.ImageFolder) and train.classes[0] == "airplane"
    assert (len(train), len(test)) == (30, 10)
    assert "RandomCrop" in repr(train.transform) and "RandomCrop" not in repr(test.transform)
    assert train[0][0].shape == (3, 32, 32)


def test_cifar10_python_batches_are_read(tmp_path, cluster, monkeypatch):
    # The official reader checks the real archive's MD5 sums, which tiny files cannot match;
    # here it only has to see the files, so the pickle parsing itself is what gets tested.
    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: Path(path).is_file())
    write_cifar10_batches(tmp_path, per_batch=8)
    train, test = load_datasets(TrainConfig(dataset="cifar10", data_dir=str(tmp_path)), cluster)
    assert isinstance(train, datasets.CIFAR10) and (len(train), len(test)) == (40, 8)
    assert train.classes[9] == "truck"


def test_incomplete_image_folder_is_a_clear_error(tmp_path, cluster):
    write_cifar10_folders(tmp_path, train=12, test=5)  # test split lacks five classes
    with pytest.raises(UserError, match="class folders"):
        load_datasets(TrainConfig(dataset="cifar10", data_dir=str(tmp_path)), cluster)


def test_corrupt_files_are_a_clear_error(tmp_path, cluster):
    write_mnist(tmp_path, train=20, test=10)
    (tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte").write_bytes(b"not an idx file")
    with pytest.raises(UserError) as error:
        load_datasets(TrainConfig(dataset="mnist", data_dir=str(tmp_path)), cluster)
    assert str(tmp_path) in str(error.value) and "corrupt" in str(error.value)


def test_missing_data_that_cannot_be_downloaded_says_what_to_do(tmp_path, cluster, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(datasets.MNIST, "download", refuse)
    with pytest.raises(UserError) as error:
        load_datasets(TrainConfig(dataset="mnist", data_dir=str(tmp_path / "nothing")), cluster)
    message = str(error.value)
    assert "nothing" in message and "network unreachable" in message and "--dataset synthetic" in message


@pytest.mark.parametrize("dataset", ["cifar10", "mnist"])
def test_a_data_dir_that_is_a_file_is_named_as_one(tmp_path, cluster, dataset):
    file = tmp_path / "data.bin"
    file.write_bytes(b"not a folder")
    with pytest.raises(UserError, match=rf"--data-dir {file} is a file, not a folder: {dataset} is read from a fol"):
        load_datasets(TrainConfig(dataset=dataset, data_dir=str(file)), cluster)
    below = file / "deeper"
    with pytest.raises(UserError, match=rf"--data-dir {below} lies under {file}, which is a file, not a folder"):
        load_datasets(TrainConfig(dataset=dataset, data_dir=str(below)), cluster)
    assert sorted(tmp_path.iterdir()) == [file] and file.read_bytes() == b"not a folder"


def test_a_failed_download_leaves_nothing_behind_and_says_the_same_again(tmp_path, cluster, monkeypatch):
    with socket.socket() as closed:  # a port nothing listens on: the download is refused, as by a dead mirror
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(datasets.MNIST, "mirrors", [f"http://127.0.0.1:{port}/"])
    existing, made = tmp_path / "data", tmp_path / "new" / "deeper"
    existing.mkdir()
    for root in (existing, made):
        messages = []
        for _ in range(2):
            with pytest.raises(UserError) as error:
                load_datasets(TrainConfig(dataset="mnist", data_dir=str(root)), cluster)
            messages.append(str(error.value))
        assert messages[0] == messages[1] and "could not be downloaded (RuntimeError: Error downloading" in messages[0]
    assert list(existing.iterdir()) == [] and not (tmp_path / "new").exists()  # no MNIST/raw/, no folder made


def test_shards_do_not_overlap_and_cover_the_data():
    train = SyntheticImages(100, (1, 28, 28), True)
    shards = [list(DistributedSampler(train, num_replicas=4, rank=r, shuffle=True, seed=3)) for r in range(4)]
    assert set().union(*map(set, shards)) == set(range(100))
    assert sum(len(s) for s in shards) == 100  # 100 divides by 4: no padding


@pytest.mark.parametrize("loader", ["resident", "dataloader"])
def test_test_shard_counts_each_sample_once(cluster, loader):
    train, test = SyntheticImages(64, (1, 28, 28), True), SyntheticImages(37, (1, 28, 28), False)
    config = TrainConfig(dataset="synthetic", batch_size=8, loader=loader)
    loaders = make_loaders(train, test, config, cluster, torch.device("cpu"))
    assert loaders.path == loader and sum(len(labels) for _, labels in loaders.test) == 37
