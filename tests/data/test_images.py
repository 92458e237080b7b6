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


def test_images_of_more_than_8_bits_are_scaled_not_clipped_and_one_no_scale_fits_is_named(tmp_path):
    from PIL import Image

    sixteen = np.arange(0, 65536, 257, dtype=np.uint16).reshape(16, 16)  # every 8-bit level, as 16-bit values
    Image.fromarray(sixteen).save(tmp_path / "scan.png")
    assert Image.open(tmp_path / "scan.png").mode == "I;16"
    clipped = np.asarray(pil_loader(str(tmp_path / "scan.png")))  # torchvision's loader: all but the black one white
    assert (clipped[..., 0].ravel() == 255).sum() == 255
    read = images.pixels(str(tmp_path / "scan.png"))
    assert read.shape == (16, 16, 3) and np.array_equal(read[..., 0].ravel(), np.arange(256))
    Image.fromarray(np.linspace(0, 1, 256, dtype=np.float32).reshape(16, 16)).save(tmp_path / "unit.tif")
    assert np.array_equal(images.pixels(str(tmp_path / "unit.tif"))[..., 1].ravel(), np.arange(256))
    Image.fromarray(np.full((4, 4), 500, dtype=np.float32)).save(tmp_path / "raw.tif")
    bad = images.pixels(str(tmp_path / "raw.tif"))
    assert isinstance(bad, images.BadImage) and str(bad).startswith(
        f"the image {tmp_path / 'raw.tif'} holds pixel values from 500 to 500 (Pillow's mode F): neither 16-bit "
        f"integers nor floats in [0, 1]")
