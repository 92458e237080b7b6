"""The decoded cache: built once, reused, rebuilt (with a note) when its sources change or it is unreadable."""

import os
import subprocess

import numpy as np
import pytest
import torch
from disk_formats import damage_an_image, write_cifar10_folders, write_mnist
from torchvision import datasets

from mpi_train.data import cache
from mpi_train.data.sets import _open_cifar10
from mpi_train.errors import UserError


@pytest.fixture()
def folders(tmp_path):
    return write_cifar10_folders(tmp_path / "data", train=30, test=10)


def build(split, path) -> list[str]:
    notes: list[str] = []
    cache.ensure(split, path, say=notes.append)
    return notes


def test_an_image_folder_is_decoded_as_torchvision_reads_it_and_reused(folders):
    split = _open_cifar10(folders, train=True)
    path = cache.cache_folder(folders) / "train.pt"
    assert path.parent == folders / cache.CACHE_FOLDER
    notes = build(split, path)
    assert len(notes) == 1 and "decoded 30 images" in notes[0]
    decoded = cache.load(path)
    assert decoded.images.shape == (30, 3, 32, 32) and decoded.images.dtype == torch.uint8
    raw = datasets.ImageFolder(str(folders / "train"))
    picture, label = raw[17]
    assert torch.equal(decoded.images[17], torch.from_numpy(np.array(picture)).permute(2, 0, 1))
    assert decoded.labels[17] == label
    assert build(split, path) == []  # fresh: nothing to say, nothing rewritten
    assert cache.checked(path, cache.fingerprint(cache.source_files(split)))  # the DataLoader path need not decode


def test_a_changed_source_file_rebuilds_the_cache(folders):
    split = _open_cifar10(folders, train=True)
    path = folders / "train.pt"
    build(split, path)
    first = cache.load(path).images.clone()
    image_path = split.samples[3][0]
    pixels = torch.full((32, 32, 3), 200, dtype=torch.uint8).numpy()
    from PIL import Image
    Image.fromarray(pixels).save(image_path)
    os.utime(image_path, ns=(1, 1))  # another modification time whatever the clock's resolution
    notes = build(split, path)
    assert len(notes) == 1 and "rebuilt (the cache was made from other versions of its source files): " in notes[0]
    rebuilt = cache.load(path).images
    assert (rebuilt[3] == 200).all() and not torch.equal(rebuilt, first)


@pytest.mark.parametrize("damage", [b"", b"not a torch file", None])
def test_an_unreadable_cache_is_rebuilt_never_used(tmp_path, damage):
    write_mnist(tmp_path, train=20, test=10)
    split = datasets.MNIST(str(tmp_path), train=True)
    path = tmp_path / "mnist.pt"
    build(split, path)
    good = cache.load(path).images.clone()
    if damage is None:  # truncated half way
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.write_bytes(damage)
    with pytest.raises(cache.Unusable):
        cache.load(path)
    notes = build(split, path)
    assert len(notes) == 1 and "rebuilt (the cache was unreadable" in notes[0]
    assert torch.equal(cache.load(path).images, good) and good.shape == (20, 1, 28, 28)


def test_a_cache_of_another_format_is_rebuilt(tmp_path):
    write_mnist(tmp_path, train=20, test=10)
    split = datasets.MNIST(str(tmp_path), train=False)
    path = tmp_path / "mnist.pt"
    torch.save({"format": cache.CACHE_FORMAT - 1, "images": torch.zeros(1, 1, 2, 2, dtype=torch.uint8),
                "labels": torch.zeros(1, dtype=torch.int64)}, path)
    assert "another format" in build(split, path)[0]
    assert cache.load(path).images.shape == (10, 1, 28, 28)


def test_a_read_only_data_folder_keeps_its_cache_in_the_users(tmp_path, monkeypatch):
    # (as root every folder is writable: the check itself is what is replaced)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    monkeypatch.setattr(cache.os, "access", lambda path, mode: False)
    folder = cache.cache_folder(tmp_path / "data")
    assert folder.parent == tmp_path / "home-cache" / "mpi_train" and folder != cache.cache_folder(tmp_path / "x")


def test_an_image_that_cannot_be_decoded_is_named_and_nothing_is_kept(folders):
    damaged = damage_an_image(folders)  # random bytes among PNGs and good JPEGs
    split = _open_cifar10(folders, train=True)
    path = cache.cache_folder(folders) / "train.pt"
    with pytest.raises(UserError) as error:
        build(split, path)
    message = str(error.value)
    assert f"the image {damaged} cannot be decoded (no image format recognised in its 1,500 bytes)" in message
    assert "Remove it, or replace it with a good copy" in message and "written" not in message
    assert not path.parent.exists() or list(path.parent.iterdir()) == []  # no cache, no verdict, no .partial


@pytest.fixture()
def full_disk(tmp_path):
    """A real tmpfs of 32 KiB: torch.save of 30 decoded images (90 KiB) runs out of space part-way."""
    folder = tmp_path / "small-disk"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(folder)], check=False,
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_is_named_with_its_reason_and_leaves_nothing(folders, full_disk):
    split = _open_cifar10(folders, train=True)
    path = full_disk / cache.CACHE_FOLDER / "cifar10-folder-train.pt"
    with pytest.raises(UserError) as error:
        build(split, path)
    message = str(error.value)
    assert f"the decoded copy {path} could not be written (No space left on device)" in message
    assert "Free space on that disk, or pass --loader dataloader" in message and "decoded (" not in message
    assert list(full_disk.iterdir()) == []  # no .partial, no cache, no verdict, not the folder made for them
