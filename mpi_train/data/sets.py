"""The data sets as torchvision reads them: CIFAR-10 (either layout), MNIST, an image folder of any classes
(folders.py), the user's own (user.py) and synthetic images; found, downloaded once per host, or refused with what to
do."""

from __future__ import annotations

import contextlib
import io
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..cluster import Cluster
from ..config import TrainConfig, resolve_uri
from ..errors import UserError
from ..memory import host_memory
from ..memory import size as memory_size
from ..models import NUM_CLASSES
from ..models.user import is_path
from . import folders, spec, text
from . import user as user_data
from .images import read_rgb
from .same_everywhere import check_same_everywhere

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
DOWNLOAD_TIMEOUT_S = 30
# what each data set's download writes in --data-dir (torchvision's layout)
DOWNLOADED = {"cifar10": ("cifar-10-python.tar.gz", "cifar-10-batches-py"), "mnist": ("MNIST",)}
# bytes held per byte of synthetic text while it is made (data/text.py synthetic_text: picks, slices, copies)
SYNTHETIC_TEXT_PEAK = 7
SYNTHETIC_DATA_SEED = 1234  # fixed, so the synthetic data set is the same whatever --seed says


class SyntheticImages(Dataset):
    """Deterministic, learnable images: a fixed pattern per class plus noise, so loss really falls."""

    def __init__(self, size: int, shape: tuple[int, int, int], train: bool):
        patterns = torch.randn(NUM_CLASSES, *shape, generator=torch.Generator().manual_seed(SYNTHETIC_DATA_SEED))
        draw = torch.Generator().manual_seed(SYNTHETIC_DATA_SEED + (1 if train else 2))
        self.labels = torch.randint(0, NUM_CLASSES, (size,), generator=draw)
        self.images = 0.5 * patterns[self.labels] + torch.randn(size, *shape, generator=draw)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.images[index], int(self.labels[index])


def synthetic_batch(config: TrainConfig, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of `samples` the model of `config` takes, and its targets: synthetic images of its input shape, or
    windows of synthetic words (the next byte of every position, flattened), for the commands that time a model
    without training it (bench, advise, predict, gpu-check)."""
    if config.language_model:
        context = config.gpt_shape.context
        train, _ = text.splits(text.synthetic_text(max(samples, 16) * (context + 1)), context, "synthetic text")
        starts = torch.randint(0, len(train) - context, (samples,),
                               generator=torch.Generator().manual_seed(SYNTHETIC_DATA_SEED))
        return text.windows(train.data, starts, context)
    images = SyntheticImages(samples, config.input_shape, train=True)
    return images.images, images.labels


def _cifar10_transforms(train: bool):
    from torchvision import transforms as T

    augment = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()] if train else []
    return T.Compose(augment + [T.ToTensor(), T.Normalize(CIFAR10_MEAN, CIFAR10_STD)])


def _image_folder_root(root: Path) -> bool:
    return (root / "train").is_dir() and (root / "test").is_dir()


def _open_cifar10(root: Path, train: bool, download: bool = False) -> Dataset:
    """CIFAR-10 from an image-folder tree (train/<class>/*) or the official python archive."""
    from torchvision import datasets

    if _image_folder_root(root):
        split = datasets.ImageFolder(str(root / ("train" if train else "test")), transform=_cifar10_transforms(train),
                                     loader=read_rgb)  # torchvision's decoding, a damaged file named
        if len(split.classes) != NUM_CLASSES:
            raise UserError(
                f"the image folder {root / ('train' if train else 'test')} has {len(split.classes)} class "
                f"folders ({', '.join(split.classes[:12])}), but CIFAR-10 needs {NUM_CLASSES}, one per class "
                f"(airplane … truck). Point --data-dir at a complete copy."
            )
        return split
    return datasets.CIFAR10(str(root), train=train, transform=_cifar10_transforms(train), download=download)


def _open_mnist(root: Path, train: bool, download: bool = False) -> Dataset:
    from torchvision import datasets
    from torchvision import transforms as T

    transform = T.Compose([T.ToTensor(), T.Normalize(MNIST_MEAN, MNIST_STD)])
    return datasets.MNIST(str(root), train=train, transform=transform, download=download)


OPENERS: dict[str, Callable[..., Dataset]] = {"cifar10": _open_cifar10, "mnist": _open_mnist}
EXPECTED_LAYOUT = {
    "cifar10": "cifar-10-batches-py/ (the official python archive) or train/<class>/*.png|jpg and test/<class>/*",
    "mnist": "MNIST/raw/ with the four IDX files",
}


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _written(name: str, root: Path) -> set[Path]:
    """What the download of `name` has written in root so far: its files and folders, and all they hold."""
    found = set()
    for top in DOWNLOADED[name]:
        path = root / top
        if path.exists() or path.is_symlink():
            found.add(path)
            if path.is_dir() and not path.is_symlink():
                found.update(path.rglob("*"))
    return found


def _undo_download(name: str, root: Path, before: set[Path], made: list[Path]) -> None:
    """Remove what a failed download wrote (half a file, an empty MNIST/raw/) and the folders it made for it: the next
    job then finds what this one found, and says the same."""
    for path in sorted(_written(name, root) - before, key=lambda path: len(path.parts)):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)  # new, so all it holds is new too
        elif path.exists() or path.is_symlink():
            path.unlink(missing_ok=True)
    for folder in made:  # deepest first; one another process has written in since stays
        try:
            folder.rmdir()
        except OSError:
            break


def _download(name: str, root: Path) -> None:
    """Fetch the data set into root unless it is there (runs on one rank per host)."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    made = [folder for folder in (root, *root.parents) if not folder.exists()]  # the folders mkdir will make
    before = _written(name, root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            for train in (True, False):
                OPENERS[name](root, train, download=True)
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001 - network, permissions, a corrupt archive: all reported the same way
        _undo_download(name, root, before, made)
        raise UserError(
            f"the {name} data set is not in {root.resolve()} (expected {EXPECTED_LAYOUT[name]}) and could "
            f"not be downloaded ({_describe(error)}). Download it on a machine with internet access and "
            f"copy it there, point --data-dir at an existing copy, or use --dataset synthetic for a run "
            f"that needs no files."
        ) from None
    finally:
        socket.setdefaulttimeout(previous)


def _unreadable(root: Path, error: OSError) -> str:
    return (f"the data in {root.resolve()} cannot be read by this user ({_describe(error)}). Make it readable "
            f"(for example chmod -R a+rX {root}), or point --data-dir at a readable copy.")


def _check_readable(split: Dataset) -> None:
    """Open the first file of an image-folder split: it reads its files only when training asks for them."""
    samples = getattr(split, "samples", None)
    if samples:
        with open(samples[0][0], "rb") as image:
            image.read(1)


def _present(name: str, root: Path) -> bool:
    """Whether the data set's folder is there (a folder with nothing in it is not: it is downloaded into)."""
    if name == "cifar10":
        return _image_folder_root(root) or (root / "cifar-10-batches-py").is_dir()
    raw = root / "MNIST" / "raw"
    return raw.is_dir() and any(raw.iterdir())


def _not_a_folder(name: str, root: Path) -> str | None:
    """Why --data-dir cannot be a folder (it, or a folder above it, is a file), or None: reading or downloading
    into it would fail with the system's word for a symptom (FileExistsError, NotADirectoryError)."""
    file = next((path for path in (root, *root.parents) if path.exists()), None)
    if file is None or file.is_dir():
        return None
    where = f"--data-dir {root} is a file" if file == root else f"--data-dir {root} lies under {file}, which is a file"
    return (f"{where}, not a folder: {name} is read from a folder that holds {EXPECTED_LAYOUT[name]}, or downloaded "
            f"into one. Point --data-dir at such a folder, or at a new one to download {name} there.")


def image_size(config: TrainConfig) -> int:
    """--image-size, or its default."""
    return spec.image_size(config.image_size)


def load_image_folder(config: TrainConfig, cluster: Cluster) -> tuple[Dataset, Dataset]:
    """An image folder's two splits, its layout checked on every rank (nothing decoded yet). Collective."""
    root, outcome, splits = Path(config.data_dir), None, None
    try:
        splits = folders.open_splits(root, image_size(config))
    except UserError as error:
        outcome = str(error)
    except OSError as error:
        outcome = _unreadable(root, error)
    cluster.agree(outcome, "cannot load imagefolder")
    if cluster.info.is_main:
        for line in filter(None, map(folders.passed_over_line, splits)):
            print(line, flush=True)
    return splits


def load_users(config: TrainConfig, cluster: Cluster) -> tuple[Dataset, Dataset]:
    """The user's two splits, each item that raises or breaks the contract named by its index. Collective."""
    outcome, data = None, None
    try:
        data = user_data.load(config.dataset, config.data_dir)
    except UserError as error:
        outcome = str(error)
    cluster.agree(outcome, f"cannot load {config.dataset}")
    return (user_data.Named(data.train, config.dataset, "training", data.num_classes, data.shape),
            user_data.Named(data.test, config.dataset, "test", data.num_classes, data.shape))


def refuse_own_outputs(root: Path, config: TrainConfig) -> None:
    """A UserError where the job's own outputs lie in the text folder --data-dir: read as text, they would make each
    rerun train on other data (the store's database, the checkpoints of the run before)."""
    uri = resolve_uri(config.tracking_uri)
    store = Path(uri.removeprefix("sqlite:///")).parent if uri.startswith("sqlite:///") else None
    outputs = {"the MLflow store": None if config.no_tracking else store, "--checkpoint-dir": config.checkpoint_dir,
               "--timeline-dir": config.timeline_folder if config.timeline_window else None,
               "--summary-json": config.summary_json}
    if not root.is_dir():
        return
    inside = [f"{what} {where}" for what, where in outputs.items()
              if where is not None and Path(where).resolve().is_relative_to(root.resolve())]
    if inside:
        raise UserError(f"--dataset text reads every file under --data-dir {root}, and this job writes there too "
                        f"({', '.join(inside)}): a rerun would train on those files as text. Put the text in a "
                        f"folder of its own and point --data-dir at it.")


def check_room_for_synthetic_text(config: TrainConfig, cluster: Cluster) -> None:
    """A UserError, before any is made, where the synthetic text (--synthetic-size windows of --context bytes, one
    copy a rank) would not fit this host's free memory: a long --context makes it large, and running out while
    making it would be blamed on the batch. Collective."""
    size, room = config.synthetic_samples * config.gpt_shape.context, host_memory()
    ranks = cluster.info.local_world_size
    short = room is not None and size * SYNTHETIC_TEXT_PEAK * ranks > room[0]
    cluster.agree(f"--dataset synthetic makes each rank --synthetic-size x --context bytes of text "
                  f"({config.synthetic_samples:,} x {config.gpt_shape.context:,} = {memory_size(size)}), and making it "
                  f"takes about {SYNTHETIC_TEXT_PEAK} times that: more than the {memory_size(room[0])} this host has "
                  f"free for its {ranks} rank(s). Lower --synthetic-size or --context." if short else None,
                  "cannot make synthetic text")


def load_text(config: TrainConfig, cluster: Cluster) -> tuple[text.TextSplit, text.TextSplit]:
    """(train, validation) bytes of --data-dir, or of synthetic words; every rank reads its own copy. Collective."""
    context = config.gpt_shape.context
    if config.dataset == "synthetic":
        check_room_for_synthetic_text(config, cluster)
        return text.splits(text.synthetic_text(config.synthetic_samples * context), context, "synthetic text")
    root, outcome, splits, files = Path(config.data_dir), None, None, []
    try:
        refuse_own_outputs(root, config)
        files = text.read_files(root)
        splits = text.splits(b"".join(data for _, data in files), context, str(root))
    except UserError as error:
        outcome = str(error)
    except OSError as error:
        outcome = _unreadable(root, error)
    cluster.agree(outcome, "cannot load text")
    warning = text.not_text_warning(files) if cluster.info.is_main else None
    if warning:
        print(f"mpi_train: warning: {warning}", file=sys.stderr, flush=True)
    return splits


def load_datasets(config: TrainConfig, cluster: Cluster) -> tuple[Dataset, Dataset]:
    """(train, test) for config.dataset, the same on every rank; downloads once per host if absent. Collective."""
    train, test = _load(config, cluster)
    if config.dataset != "synthetic":  # made from the seed alike everywhere
        check_same_everywhere(config.dataset, train, test, cluster)
    return train, test


def _load(config: TrainConfig, cluster: Cluster) -> tuple[Dataset, Dataset]:
    if config.language_model:  # text, or synthetic words
        return load_text(config, cluster)
    if config.dataset == "synthetic":
        shape = config.input_shape
        test_size = max(1, config.synthetic_samples // 4)
        return SyntheticImages(config.synthetic_samples, shape, True), SyntheticImages(test_size, shape, False)
    if config.dataset == "imagefolder":
        return load_image_folder(config, cluster)
    if is_path(config.dataset):
        return load_users(config, cluster)

    root = Path(config.data_dir)
    what = f"cannot load {config.dataset}"
    try:
        outcome = _not_a_folder(config.dataset, root)
        present = outcome is not None or _present(config.dataset, root)
    except OSError as error:  # a folder this user may not enter: downloading into it would fail too
        present, outcome = True, _unreadable(root, error)
    cluster.agree(outcome, what)
    # every rank takes part, even on hosts that have the data
    everywhere = all(cluster.allgather(present))
    if not everywhere:
        cluster.run_per_host(lambda: _present(config.dataset, root) or _download(config.dataset, root), what)
    try:
        splits = OPENERS[config.dataset](root, True), OPENERS[config.dataset](root, False)
        for split in splits:
            _check_readable(split)
    except UserError as error:
        outcome = str(error)
    except PermissionError as error:
        outcome = _unreadable(root, error)
    except Exception as error:  # noqa: BLE001 - whatever reading a broken copy raises: all reported the same way
        outcome = (
            f"the copy in {root.resolve()} could not be read ({_describe(error)}); it is incomplete, "
            f"unreadable or corrupt. Expected {EXPECTED_LAYOUT[config.dataset]}. Delete it to download "
            f"it again, or point --data-dir at a good copy."
        )
    cluster.agree(outcome, what)
    return splits
