"""An image folder of any classes, sizes and modes (--dataset imagefolder), in ImageNet's layout:

    DATA/train/<class>/*.jpg|png|...    DATA/val/<class>/*  (or DATA/test/<class>/*)

The classes are train/'s folders, sorted, hidden ones left out, as torchvision's ImageFolder orders them; a label is
its class's position there, so val/ must hold the same folders. Every image is decoded to RGB (greyscale, palette and
RGBA alike, as torchvision's loader converts them), resized so its shorter side is `stored_size(S)` (S x 8/7, S being
--image-size) and centre-cropped to that square: what both data paths start from, and what the resident path's cache
holds. Training then takes a random resized crop of S x S and flips it; evaluation takes the centre S x S. These are
torchvision's classification references (RandomResizedCrop + flip to train, Resize(S x 8/7) + CenterCrop(S) to
evaluate), the training crop taken from the stored square rather than the full file so that both paths crop the same
pixels and the cache stays S x 8/7 wide.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

from torch.utils.data import Dataset

from ..errors import UserError
from .images import read_rgb

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEFAULT_IMAGE_SIZE = 64
RESIZE_RATIO = 256 / 224  # torchvision's evaluation: resized to 256, centre 224 kept
EVALUATION_FOLDERS = ("val", "test")  # the first one there scores the model
LAYOUT = "train/<class>/* and val/<class>/* (or test/<class>/*), one folder per class"
# the file names torchvision's ImageFolder reads as images; any other file in a class folder is left out
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SHOWN = 4  # folders a paragraph names before it counts the rest


def stored_size(size: int) -> int:
    """The side of the square each image is kept at for training at `size`: evaluation's resize."""
    return round(size * RESIZE_RATIO)


def _named(paths: list[str]) -> str:
    more = f" and {len(paths) - SHOWN:,} more" if len(paths) > SHOWN else ""
    return ", ".join(paths[:SHOWN]) + more


def split_folders(root: Path) -> tuple[Path, Path]:
    """train/ and the evaluation folder (val/, else test/) under `root`; a UserError with the layout when either is
    missing."""
    evaluation = next((root / name for name in EVALUATION_FOLDERS if (root / name).is_dir()), None)
    if (root / "train").is_dir() and evaluation is not None:
        return root / "train", evaluation
    if not root.is_dir():
        where = f"--data-dir {root} is {'a file' if root.exists() else 'not there'}"
    else:
        lacking = " and ".join(name for name, there in (("train/", (root / "train").is_dir()),
                                                        ("val/ or test/", evaluation is not None)) if not there)
        where = f"{root.resolve()} has no {lacking}"
    raise UserError(f"{where}: --dataset imagefolder reads {LAYOUT} under --data-dir (train/ to learn from, val/ or "
                    f"test/ to score the model). Point --data-dir at such a folder, or make one: a folder per class "
                    f"in each, with the same class names in both.")


def class_names(folder: Path) -> list[str]:
    """The class folders of a split, sorted, hidden ones left out: a label is a class's position here; a UserError
    when the folder cannot be listed."""
    try:
        with os.scandir(folder) as entries:
            return sorted(entry.name for entry in entries if entry.is_dir() and not entry.name.startswith("."))
    except OSError as error:
        raise UserError(f"the image folder {folder.resolve()} cannot be read by this user ({type(error).__name__}: "
                        f"{error.strerror or error}). Make it readable (for example chmod -R a+rX "
                        f"{folder.parent}), or point --data-dir at a readable copy.") from None


def classes(root: Path) -> list[str]:
    """The classes of the image folder at `root` (train/'s class folders); a UserError when it has fewer than two."""
    train, _ = split_folders(root)
    names = class_names(train)
    if len(names) > 1:
        return names
    if names:  # one class: every label is 0, so the loss falls to 0 and the accuracy is 100% from the first steps
        raise UserError(f"{train} has one class folder ({names[0]}): a classifier learns to tell classes apart, and "
                        f"with one it scores 100% having learnt nothing. Add a folder for each other class, under "
                        f"train/ and {EVALUATION_FOLDERS[0]}/ (or {EVALUATION_FOLDERS[1]}/) alike.")
    with os.scandir(train) as entries:
        loose = sum(1 for entry in entries if entry.is_file() and entry.name.lower().endswith(EXTENSIONS))
    held = (f"it holds {loose:,} image file(s) directly, and" if loose else "it is empty:") + " a label is the folder"
    raise UserError(f"{train} has no class folders: {held} an image lies in. Put each class's images in a folder of "
                    f"its own (train/cat/*.jpg, train/dog/*.jpg, ...), and the same folders under "
                    f"{EVALUATION_FOLDERS[0]}/ or {EVALUATION_FOLDERS[1]}/.")


def _check_same_classes(train: Path, evaluation: Path, names: list[str]) -> None:
    theirs = class_names(evaluation)
    if theirs == names:
        return
    missing, extra = sorted(set(names) - set(theirs)), sorted(set(theirs) - set(names))
    differences = "; ".join(part for part in (f"it lacks {_named(missing)}" if missing else "",
                                              f"it has {_named(extra)}, which {train} lacks" if extra else "") if part)
    raise UserError(f"the class folders of {evaluation} differ from those of {train} ({len(theirs):,} classes "
                    f"against {len(names):,}: {differences}). A label is the position of its class among train/'s "
                    f"folders, so a class missing from one split would score another class's images. Give both splits "
                    f"the same class folders (each with images).")


def transforms(size: int, train: bool):
    """The DataLoader path's transforms: the stored square (`prepared`), then the random resized crop and flip to
    train, the centre crop to evaluate, as the resident path computes them on whole batches (augment.py)."""
    from torchvision import transforms as T  # here, not at the top: a second of import for a data set that needs it

    chosen = [T.RandomResizedCrop(size), T.RandomHorizontalFlip()] if train else [T.CenterCrop(size)]
    return T.Compose([prepared(size), *chosen, T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def prepared(size: int):
    """Decoded once: resized so the shorter side is stored_size(size), then the centre square of that side."""
    from torchvision import transforms as T

    side = stored_size(size)
    return T.Compose([T.Resize(side), T.CenterCrop(side)])


def is_image(path: str) -> bool:
    """A file the split reads as an image: an image's ending, and not hidden (macOS's ._name.jpg holds no image)."""
    name = os.path.basename(path)
    return not name.startswith(".") and name.lower().endswith(EXTENSIONS)


class FolderSplit(Dataset):
    """One split of an image folder as torchvision's ImageFolder holds it (root, classes, samples, targets), with
    train/'s classes, and `prepare`, the stored square, which the resident path's cache decodes once
    (cache.decode). An image that cannot be read or decoded raises BadImage naming its file. `passed_over` counts the
    files of its class folders read as no image by their endings (a .gif, say), so that the job can say so."""

    def __init__(self, folder: Path, names: list[str], size: int, train: bool):
        from torchvision.datasets.folder import make_dataset  # here, not at the top: as in transforms()

        self.root, self.classes = str(folder), names
        self.class_to_idx = {name: index for index, name in enumerate(names)}
        self.passed_over: collections.Counter[str] = collections.Counter()
        self.broken_links: list[str] = []  # image names whose link leads nowhere: they would fail at the first read
        self.samples = make_dataset(self.root, self.class_to_idx, is_valid_file=self._is_image, allow_empty=True)
        self.targets = [target for _, target in self.samples]
        self.transform, self.prepare, self.stored = transforms(size, train), prepared(size), stored_size(size)

    def _is_image(self, path: str) -> bool:
        if is_image(path):
            if not os.path.exists(path):
                self.broken_links.append(path)
                return False
            return True
        name = os.path.basename(path)
        if not name.startswith("."):
            self.passed_over[os.path.splitext(name)[1].lower() or "(no ending)"] += 1
        return False

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        return self.transform(read_rgb(path)), target


def reached_twice(folder: Path) -> tuple[str, str] | None:
    """Two folders under `folder` that are one folder, reached through a link (a link to a folder above it loops, and
    torchvision's walk follows links): their images would be read again under other classes. None when there are
    none. Folders only are resolved, so that a large set's start pays for its folders, not its files."""
    seen: dict[str, str] = {}
    for here, _, _ in os.walk(folder, followlinks=True):
        real = os.path.realpath(here)
        if real in seen:
            return seen[real], here
        seen[real] = here
    return None


def open_split(folder: Path, size: int, train: bool, names: list[str]) -> FolderSplit:
    """One split; a UserError naming every class folder without images."""
    if twice := reached_twice(folder):
        raise UserError(f"{twice[1]} is {twice[0]} again, reached through a link (a link to a folder above it "
                        f"loops): its images would be read more than once, under other classes. Remove the link, or "
                        f"copy what it leads to.")
    split = FolderSplit(folder, names, size, train)
    if split.broken_links:
        links = split.broken_links
        raise UserError(f"{folder} holds {len(links):,} link(s) to no file ({_named(links)}; {links[0]} leads to "
                        f"{os.readlink(links[0])}, which does not exist): the job would fail at its first read. "
                        f"Remove them, or restore what they lead to.")
    counts = collections.Counter(split.targets)
    empty = [str(folder / name) for index, name in enumerate(names) if not counts[index]]
    unreadable = [f"{path} ({reason})" for path in empty if (reason := folder_unreadable(Path(path)))]
    if unreadable:
        them = "it" if len(unreadable) == 1 else "them"
        which = "that class folder" if len(unreadable) == 1 else "those class folders"
        raise UserError(f"{_named(unreadable)}: this user cannot read {which}, so none of its images can be found. "
                        f"Make {them} readable (chmod u+rx), or remove the class from both splits.")
    if empty:
        raise UserError(f"{len(empty):,} of the {len(names):,} class folders of {folder} hold no images "
                        f"({_named(empty)}): a class without images cannot be {'learnt' if train else 'scored'}. "
                        f"Images are files ending {', '.join(EXTENSIONS)} (hidden ones left out); add some to each, "
                        f"or remove the class from both splits.")
    return split


def folder_unreadable(folder: Path) -> str | None:
    """Why this user cannot list `folder`, or None when it can."""
    try:
        with os.scandir(folder):
            return None
    except OSError as error:
        return error.strerror or str(error)


def passed_over_line(split: FolderSplit) -> str | None:
    """`left out 6 file(s) of DATA/train whose endings are not an image's (.gif 6): ...`, or None when none was."""
    if not split.passed_over:
        return None
    endings = ", ".join(f"{ending} {count:,}" for ending, count in split.passed_over.most_common())
    return (f"mpi_train: left out {split.passed_over.total():,} file(s) of {split.root} whose endings are not an "
            f"image's ({endings}): images are files ending {', '.join(EXTENSIONS)}. Convert the others to one of "
            f"these to train on them.")


def open_splits(root: Path, size: int):
    """(train, evaluation) of the image folder at `root` for images of `size`; a UserError for a layout it cannot
    train on: no train/ or val/ (test/), no class folders, a class without images, or splits whose classes differ."""
    train, evaluation = split_folders(root)
    names = classes(root)
    _check_same_classes(train, evaluation, names)
    return open_split(train, size, True, names), open_split(evaluation, size, False, names)
