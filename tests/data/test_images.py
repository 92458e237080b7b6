"""Image files read as torchvision reads them (mpi_train/data/images.py): a file that cannot be decoded, or cannot be
read, named with its path and its reason, and told apart."""

import numpy as np
from disk_formats import damage_an_image, write_cifar10_folders
from torchvision.datasets.folder import pil_loader

from mpi_train.data import images


def test_damaged_and_unreadable_files_are_found_and_told_apart(tmp_path):
    data = write_cifar10_folders(tmp_path / "data", train=20, test=10)
    garbage = damage_an_image(data)  # random bytes among PNGs and good JPEGs
    good_jpeg = min(path for path in (data / "train").rglob("*.jpg") if path != garbage)
    assert np.array_equal(images.pixels(str(good_jpeg)), np.asarray(pil_loader(str(good_jpeg))))  # torchvision's
    truncated = good_jpeg.with_name("truncated.jpg")
    truncated.write_bytes(good_jpeg.read_bytes()[:300])
    unreadable = good_jpeg.with_name("folder.png")
    unreadable.mkdir()  # an image path that cannot be read as a file, even by root
    paths = sorted(str(path) for path in (data / "train").rglob("*.*"))
    bad = images.find_bad(paths, threads=3)
    assert [entry.path for entry in bad] == sorted(map(str, (garbage, truncated, unreadable)))
    reasons = {entry.path: entry for entry in bad}
    assert reasons[str(garbage)].reason == "no image format recognised in its 1,500 bytes"
    assert reasons[str(truncated)].reason.startswith("OSError: ") and reasons[str(truncated)].readable
    assert not reasons[str(unreadable)].readable and "cannot be read (Is a directory)" in str(reasons[str(unreadable)])
    message = images.describe(bad)
    assert message.startswith(f"the image {bad[0].path} cannot be ") and "2 more image(s) cannot be read or" in message
