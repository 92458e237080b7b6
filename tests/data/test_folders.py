"""An image folder of any classes, sizes and modes (mpi_train/data/folders.py): its classes, the model built for them,
both data paths over real files made here with PIL, and one paragraph for each layout it cannot train on, in one
process."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO
from disk_formats import write_image_folder
from PIL import Image
from torchvision import transforms as T

from mpi_train.cluster import Cluster
from mpi_train.config import TrainConfig
from mpi_train.data import cache, folders, load_datasets, make_loaders, same_everywhere
from mpi_train.data.images import read_rgb
from mpi_train.errors import UserError

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cluster():
    return Cluster.from_mpi()


def folder_config(data, **settings) -> TrainConfig:
    return TrainConfig(**{"dataset": "imagefolder", "data_dir": str(data), "batch_size": 4, **settings})


def test_the_classes_are_trains_folders_and_every_image_mode_reads_as_rgb(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=3, train=6, evaluation=2)
    (data / "train" / ".ipynb_checkpoints").mkdir()  # hidden: not a class
    (data / "train" / "class1" / "notes.txt").write_text("not an image")  # not an image's ending: left out
    (data / "train" / "class1" / "._000.jpg").write_bytes(b"\0\5\26\7")  # macOS's resource fork: hidden, left out
    nested = data / "train" / "class2" / "more"
    nested.mkdir()
    Image.new("L", (20, 20), 99).save(nested / "deep.PNG")  # nested, upper-case ending: read, as torchvision reads it
    train, val = folders.open_splits(data, 32)
    assert train.classes == val.classes == ["class0", "class1", "class2"]
    assert len(train) == 3 * 6 + 1 and len(val) == 3 * 2
    assert sorted(set(train.targets)) == [0, 1, 2] and train.targets.count(2) == 7
    assert val.root == str(data / "val") and train.stored == folders.stored_size(32) == 37
    modes = {Image.open(path).mode for path, _ in train.samples}
    assert modes == {"RGB", "L", "RGBA", "P"}
    image, label = train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and label == 0
    Image.new("RGB", (20, 20)).save(data / "train" / "class0" / "moving.gif")
    train, val = folders.open_splits(data, 32)
    assert folders.passed_over_line(val) is None
    line = folders.passed_over_line(train)  # the hidden files are no one's images: only these two are said
    assert line.startswith(f"mpi_train: left out 2 file(s) of {data / 'train'} whose endings")
    assert "(.gif 1, .txt 1)" in line


def test_the_class_count_and_image_size_reach_the_model(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=5, train=1, evaluation=1)
    config = folder_config(data)
    assert config.data_spec == ((3, 64, 64), 5) and config.model_name == "resnet18"
    config.validate(world_size=2)
    assert config.make_model()(torch.zeros(2, 3, 64, 64)).shape == (2, 5)
    small = folder_config(data, image_size=40, model="vgg11")
    assert small.input_shape == (3, 40, 40) and small.make_model()(torch.zeros(2, 3, 40, 40)).shape == (2, 5)
    grey_net = folder_config(data, model="mnist_cnn")  # built for 3 channels and 64x64
    assert grey_net.make_model()(torch.zeros(2, 3, 64, 64)).shape == (2, 5)
    with pytest.raises(UserError, match=r"--model vgg11 \(built-in\) cannot take imagefolder's images \(3, 16, 16\)"):
        folder_config(data, image_size=16, model="vgg11").validate(world_size=1)
    with pytest.raises(UserError, match="--image-size is read by --dataset imagefolder only"):
        TrainConfig(dataset="synthetic", image_size=64).validate(world_size=1)


def test_the_cache_holds_the_stored_squares_and_both_paths_serve_the_same_batches(tmp_path, cluster, capsys):
    data = write_image_folder(tmp_path / "data", classes=5, train=3, evaluation=2)
    config = folder_config(data, image_size=24)
    splits = load_datasets(config, cluster)
    resident = make_loaders(*splits, config, cluster, CPU)
    loader = make_loaders(*splits, folder_config(data, image_size=24, loader="dataloader"), cluster, CPU)
    assert resident.path == "resident" and loader.path == "dataloader"
    assert resident.resident_bytes == (15 + 10) * (3 * 27 * 27 + 8)
    built = capsys.readouterr().out
    assert "decoded 15 images of 15 file(s) once into" in built and "imagefolder-train-27px.pt (0.0 MiB)" in built
    held = cache.load(cache.cache_folder(data) / "imagefolder-train-27px.pt")
    path = splits[0].samples[4][0]
    stored = folders.prepared(24)(read_rgb(path))  # the DataLoader path's first transforms
    assert torch.equal(held.images[4], torch.from_numpy(np.array(stored)).permute(2, 0, 1))
    ours, theirs = list(resident.train), list(loader.train)
    assert [labels.tolist() for _, labels in ours] == [labels.tolist() for _, labels in theirs]
    assert all(a.shape == b.shape == (len(a), 3, 24, 24) and a.dtype == b.dtype for (a, _), (b, _) in zip(ours, theirs))
    for (a, a_labels), (b, b_labels) in zip(resident.test, loader.test):  # resize and centre crop: the same pixels
        assert torch.equal(a, b) and torch.equal(a_labels, b_labels)


def test_a_file_that_cannot_be_decoded_stops_either_path_before_training_with_its_path(tmp_path, cluster):
    data = write_image_folder(tmp_path / "data", classes=5, train=2, evaluation=1)
    broken = data / "train" / "class3" / "broken.jpg"
    broken.write_bytes(np.random.default_rng(5).integers(0, 256, 900, dtype=np.uint8).tobytes())
    for path in ("resident", "dataloader"):
        config = folder_config(data, loader=path)
        with pytest.raises(UserError) as error:
            make_loaders(*load_datasets(config, cluster), config, cluster, CPU)
        assert f"the image {broken} cannot be decoded (no image format recognised in its 900 bytes)" in str(error.value)
    broken.unlink()
    config = folder_config(data)
    assert make_loaders(*load_datasets(config, cluster), config, cluster, CPU).path == "resident"


def test_a_set_that_does_not_fit_takes_the_dataloader_and_says_so(tmp_path, cluster, capsys, monkeypatch):
    from mpi_train.data import loaders

    data = write_image_folder(tmp_path / "data", classes=2, train=2, evaluation=1)
    monkeypatch.setattr(loaders, "free_bytes", lambda device: 2 ** 16)  # its half: less than 6 images at 73x73 take
    config = folder_config(data)
    chosen = make_loaders(*load_datasets(config, cluster), config, cluster, CPU)
    said = capsys.readouterr().out
    assert chosen.path == "dataloader" and "checked that the 4 images under" in said
    assert said.startswith("mpi_train: imagefolder at --image-size 64 would take 0.1 MiB per rank held decoded, more "
                           "than half of the 0.1 MiB free on cpu: it is read")
    assert "read through torch's DataLoader instead (--loader auto), with 0 worker process(es)" in said


@pytest.mark.parametrize("layout,words", [
    ("no val", "has no val/ or test/: --dataset imagefolder reads train/<class>/* and val/<class>/*"),
    ("missing", "--data-dir {data} is not there: --dataset imagefolder reads"),
    ("loose", "{data}/train has no class folders: it holds 3 image file(s) directly, and a label is the folder"),
    ("empty class", ("1 of the 5 class folders of {data}/train hold no images ({data}/train/class2): a class "
                     "without images cannot be learnt")),
    ("no images", "5 of the 5 class folders of {data}/val hold no images"),
    ("classes differ", ("the class folders of {data}/val differ from those of {data}/train (5 classes against 5: it "
                        "lacks class4; it has dog, which {data}/train lacks)")),
    ("one class", "{data}/train has one class folder (class0): a classifier learns to tell classes apart"),
    ("link loop", ("{data}/train/class1/up is {data}/train again, reached through a link (a link to a folder above "
                   "it loops): its images would be read more than once, under other classes")),
    ("broken link", ("{data}/train holds 1 link(s) to no file ({data}/train/class1/gone.png; {data}/train/class1/"
                     "gone.png leads to /nowhere/gone.png, which does not exist): the job would fail at its first")),
])
def test_a_layout_it_cannot_train_on_is_one_paragraph(tmp_path, cluster, layout, words):
    data = tmp_path / "data"
    if layout != "missing":
        write_image_folder(data, classes=5, train=1, evaluation=1)
    if layout == "no val":
        shutil.rmtree(data / "val")
    elif layout == "loose":  # the images of a class straight in train/
        shutil.rmtree(data / "train")
        (data / "train").mkdir()
        for index in range(3):
            Image.new("RGB", (20, 20), (index, 0, 0)).save(data / "train" / f"{index}.png")
    elif layout == "empty class":
        shutil.rmtree(data / "train" / "class2")
        (data / "train" / "class2").mkdir()
    elif layout == "no images":
        for image in (data / "val").rglob("*.*"):
            image.unlink()
    elif layout == "classes differ":
        (data / "val" / "class4").rename(data / "val" / "dog")
    elif layout == "link loop":
        (data / "train" / "class1" / "up").symlink_to("..")
    elif layout == "broken link":
        (data / "train" / "class1" / "gone.png").symlink_to("/nowhere/gone.png")
    elif layout == "one class":
        for split in ("train", "val"):
            for extra in range(1, 5):
                shutil.rmtree(data / split / f"class{extra}")
    with pytest.raises(UserError) as error:
        load_datasets(folder_config(data), cluster)
    message = str(error.value)
    assert message.startswith("cannot load imagefolder: ") and words.format(data=data) in message
    assert "\n" not in message and "Traceback" not in message


def test_a_class_folder_this_user_cannot_read_is_named_as_such_not_as_empty(tmp_path):
    """Root reads any folder: the check runs without the capabilities that let it (setpriv), as a user would."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): a folder cannot be made unreadable to root")
    data = write_image_folder(tmp_path / "data", classes=3, train=1, evaluation=1)
    (data / "train" / "class1").chmod(0)
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    check = f"from mpi_train.data.folders import open_splits; open_splits(__import__('pathlib').Path('{data}'), 32)"
    try:
        result = subprocess.run([*prefix, sys.executable, "-c", check], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    finally:
        (data / "train" / "class1").chmod(0o755)
    assert (f"UserError: {data}/train/class1 (Permission denied): this user cannot read that class folder, so none "
            f"of its images can be found. Make it readable (chmod u+rx)") in result.stderr, result.stderr


def test_an_image_past_pillows_pixel_limit_is_named_as_too_large_not_as_damaged():
    from mpi_train.data.images import BadImage

    said = str(BadImage("scan.png", "DecompressionBombError: Image size (182000000 pixels) exceeds limit of "
                                    "178956970 pixels, could be decompression bomb DOS attack."))
    assert said.startswith("the image scan.png is larger than Pillow decodes (DecompressionBombError: Image size "
                           "(182000000 pixels)") and "Downscale it" in said and "damaged" not in said


def test_the_transforms_are_torchvisions_references_on_the_stored_square():
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 80, 3), dtype=np.uint8))
    stored = folders.prepared(28)(picture)
    assert stored.size == (32, 32)  # 28 x 8/7: the shorter side resized to 32, the centre square kept
    evaluation = folders.transforms(28, train=False)(picture)
    reference = T.Compose([T.Resize(32), T.CenterCrop(32), T.CenterCrop(28), T.ToTensor(),
                           T.Normalize(folders.IMAGENET_MEAN, folders.IMAGENET_STD)])(picture)
    assert torch.equal(evaluation, reference)
    names = [type(step).__name__ for step in folders.transforms(28, train=True).transforms]
    assert names == ["Compose", "RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]


def test_copies_of_a_folder_read_alike_wherever_they_lie_and_a_missing_file_tells_them_apart(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=3, train=4, evaluation=2)
    copy = shutil.copytree(data, tmp_path / "elsewhere" / "copy")
    read = same_everywhere.what_was_read(*folders.open_splits(data, 32))
    assert read == same_everywhere.what_was_read(*folders.open_splits(copy, 32))
    assert read["training samples"] == 12 and read["classes"] == 3
    first = copy / "train" / "class1" / min(os.listdir(copy / "train" / "class1"))
    first.rename(first.with_name("renamed.png"))  # as many files, one named otherwise
    other = same_everywhere.what_was_read(*folders.open_splits(copy, 32))
    assert other["training samples"] == 12 and other["training file names (hashed)"] != read[
        "training file names (hashed)"] and other["test file names (hashed)"] == read["test file names (hashed)"]
