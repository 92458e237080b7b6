"""The resident data path against the DataLoader path: the same samples in the same order, the same pixels where
nothing is random, and augmentation that is each rank's own, reproducible and resumable, in one process."""

from pathlib import Path

import pytest
import torch
from disk_formats import write_cifar10_folders, write_mnist

from mpi_train.cluster import Cluster
from mpi_train.config import TrainConfig
from mpi_train.data import load_datasets, make_loaders
from mpi_train.data.augment import CropFlip
from mpi_train.data.resident import ResidentSplit, ResidentTrainLoader, augmentation_seed
from mpi_train.data.sampler import ResumableSampler

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cluster():
    return Cluster.from_mpi()


def both_paths(config: TrainConfig, cluster):
    splits = load_datasets(config, cluster)
    return [make_loaders(*splits, TrainConfig(**{**config.__dict__, "loader": path}), cluster, CPU)
            for path in ("resident", "dataloader")]


def test_mnist_batches_are_the_dataloaders_bit_for_bit(tmp_path, cluster):
    write_mnist(tmp_path, train=50, test=12)
    resident, loader = both_paths(TrainConfig(dataset="mnist", data_dir=str(tmp_path), batch_size=16), cluster)
    assert resident.path == "resident" and loader.path == "dataloader"
    assert resident.resident_bytes == (50 + 12) * (28 * 28 + 8)
    assert len(resident.train) == len(loader.train) == 4
    for which in ("train", "test"):
        for (ours, our_labels), (theirs, their_labels) in zip(getattr(resident, which), getattr(loader, which)):
            assert torch.equal(ours, theirs) and torch.equal(our_labels, their_labels)
    resident.sampler.set_epoch(1)
    loader.sampler.set_epoch(1)  # a new epoch, a new order, the same on both paths
    assert [labels.tolist() for _, labels in resident.train] == [labels.tolist() for _, labels in loader.train]


def test_cifar10_batches_take_the_same_images_in_the_same_order(tmp_path, cluster):
    write_cifar10_folders(tmp_path, train=40, test=10)
    resident, loader = both_paths(TrainConfig(data_dir=str(tmp_path), batch_size=16), cluster)
    ours, theirs = list(resident.train), list(loader.train)
    assert [labels.tolist() for _, labels in ours] == [labels.tolist() for _, labels in theirs]
    assert all(a.shape == b.shape and a.dtype == b.dtype for (a, _), (b, _) in zip(ours, theirs))
    assert not torch.equal(ours[0][0], theirs[0][0])  # augmented: other draws
    for (a, _), (b, _) in zip(resident.test, loader.test):  # not augmented: the same pixels
        assert torch.equal(a, b)


def split_of(count: int) -> ResidentSplit:
    images = torch.randint(0, 256, (count, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return ResidentSplit(images, torch.arange(count), CPU, ((0.5,) * 3, (0.25,) * 3), CropFlip(32, CPU))


def passes(split, world_size: int, batch: int, seed: int = 3, epoch: int = 0) -> list[list[torch.Tensor]]:
    """Each rank's batches of one pass."""
    ranks = []
    for rank in range(world_size):
        sampler = ResumableSampler(split, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        ranks.append(list(ResidentTrainLoader(split, sampler, batch, seed, rank)))
    return ranks


def test_each_step_takes_the_same_global_batch_for_every_world_size():
    split = split_of(96)
    one = passes(split, 1, 32)[0]
    for world_size in (2, 4):
        ranks = passes(split, world_size, 32 // world_size)
        for step, (_, labels) in enumerate(one):
            together = torch.cat([ranks[rank][step][1] for rank in range(world_size)])
            assert sorted(together.tolist()) == sorted(labels.tolist())


def test_augmentation_is_each_ranks_own_and_reproducible():
    split = split_of(64)
    before = torch.get_rng_state()
    first, again = passes(split, 2, 8), passes(split, 2, 8)
    assert torch.equal(torch.get_rng_state(), before)  # torch's global stream untouched: dropout draws the same
    assert all(torch.equal(a[0], b[0]) for rank_a, rank_b in zip(first, again) for a, b in zip(rank_a, rank_b))
    next_epoch = passes(split, 2, 8, epoch=1)
    assert not torch.equal(first[0][0][0], next_epoch[0][0][0])
    assert len({augmentation_seed(42, rank, epoch) for rank in range(4) for epoch in range(4)}) == 16


def test_a_resumed_pass_serves_exactly_the_batches_left():
    split = split_of(80)
    whole = passes(split, 2, 8)[1]
    sampler = ResumableSampler(split, num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(0)
    sampler.skip_next(3 * 8)
    resumed = list(ResidentTrainLoader(split, sampler, 8, 3, 1))
    assert len(resumed) == len(whole) - 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(resumed, whole[3:]))
    assert len(list(ResidentTrainLoader(split, sampler, 8, 3, 1))) == len(whole)  # the skip was used up


def test_the_dataloader_path_takes_workers_only_when_asked_on_cpus(tmp_path, cluster):
    train, test = load_datasets(TrainConfig(dataset="synthetic", synthetic_size=64), cluster)
    config = TrainConfig(dataset="synthetic", loader="dataloader", batch_size=16)
    assert make_loaders(train, test, config, cluster, CPU).train.num_workers == 0
    two = make_loaders(train, test, TrainConfig(**{**config.__dict__, "loader_workers": 2}), cluster, CPU)
    assert two.train.num_workers == 2 and two.describe() == "DataLoader, 2 worker(s)"
    assert sum(len(labels) for _, labels in two.train) == 64


def test_cifar10_pickles_are_decoded_for_the_resident_path_too(tmp_path, cluster, monkeypatch):
    from disk_formats import write_cifar10_batches
    from torchvision.datasets import cifar

    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: Path(path).is_file())  # tiny pickles
    write_cifar10_batches(tmp_path, per_batch=8)
    resident, loader = both_paths(TrainConfig(data_dir=str(tmp_path), batch_size=8), cluster)
    assert resident.path == "resident" and resident.resident_bytes == (40 + 8) * (3 * 32 * 32 + 8)
    assert sorted((tmp_path / ".mpi_train-cache").iterdir()) == [tmp_path / ".mpi_train-cache" / "cifar10-test.pt",
                                                                 tmp_path / ".mpi_train-cache" / "cifar10-train.pt"]
    for (ours, our_labels), (theirs, their_labels) in zip(resident.test, loader.test):
        assert torch.equal(ours, theirs) and torch.equal(our_labels, their_labels)


def test_a_pass_that_would_end_in_a_batch_of_one_leaves_it_out_on_every_rank_and_either_path(cluster):
    # 17 samples over 2 ranks: 9 each (DistributedSampler repeats one), in batches of 4, 4 and 1
    ranks = [ResumableSampler(range(17), num_replicas=2, rank=rank, shuffle=True, seed=0, batch_size=4)
             for rank in range(2)]
    whole = [ResumableSampler(range(17), num_replicas=2, rank=rank, shuffle=True, seed=0) for rank in range(2)]
    for sampler, unbatched in zip(ranks, whole):
        assert sampler.left_out == 1 and len(sampler) == 8 and list(sampler) == list(unbatched)[:8]
    assert ResumableSampler(range(17), num_replicas=2, rank=0, batch_size=3).left_out == 0  # 9 = 3 x 3
    assert ResumableSampler(range(2), num_replicas=2, rank=0, batch_size=1).left_out == 0  # a batch of one was asked
    resident, loader = both_paths(TrainConfig(dataset="synthetic", synthetic_size=33, batch_size=16), cluster)
    for path in (resident, loader):
        assert len(path.train) == 2 and [len(labels) for _, labels in path.train] == [16, 16]
