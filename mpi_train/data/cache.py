"""Data sets decoded once into uint8 tensors, kept in a file beside the data for every later job.

Decoding 60,000 JPEGs takes seconds; reading them back as one tensor takes milliseconds, and a file that
is mapped into memory (torch.load's mmap) is shared by all the ranks of a host through the page cache. The
file records a fingerprint of its sources (every file's path, size and modification time): when they change,
or the file cannot be read, it is rebuilt with a one-line note and never used as it is. One rank per host builds
it (written atomically, so a reader never sees half a file); the others wait, then map it. Beside it, a record of
the same fingerprint says that every image of an image folder decoded, so that the DataLoader path, which decodes
them one by one as training asks, checks them once per version of the files, not once per job (loaders.py).
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from torch.utils.data import Dataset

from ..errors import UserError, system_error
from ..files import write_atomically
from . import images as image_files

CACHE_FORMAT = 2  # raised whenever what a cache file holds changes: older ones are then rebuilt
CACHE_FOLDER = ".mpi_train-cache"  # inside --data-dir, when it is writable
CHECKED_SUFFIX = ".checked"  # beside a cache file: the fingerprint of image files that all decoded
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class Decoded:
    """A split as tensors: images uint8 (N, C, H, W), labels int64 (N,), in the data set's own index order."""

    images: torch.Tensor
    labels: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.images.nbytes + self.labels.nbytes


def source_files(split: Dataset) -> list[Path]:
    """The files a torchvision split is read from: an image folder's images, CIFAR-10's pickles, MNIST's IDX files."""
    if hasattr(split, "samples"):  # ImageFolder
        return [Path(path) for path, _ in split.samples]
    if hasattr(split, "train_list"):  # CIFAR10
        files = split.train_list if split.train else split.test_list
        return [Path(split.root) / split.base_folder / name for name, _ in files]
    prefix = "train" if split.train else "t10k"  # MNIST
    return sorted(Path(split.raw_folder).glob(f"{prefix}-*-ubyte"))


def fingerprint(files: list[Path]) -> str:
    """Every source file's path, size and modification time, hashed: another file, or one rewritten, changes it."""
    digest = hashlib.sha256()
    for path in files:
        status = path.stat()
        digest.update(f"{path}\0{status.st_size}\0{status.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _decode_files(split: Dataset) -> torch.Tensor:
    """An image folder's images as uint8 (N, C, H, W), each after the split's `prepare` if it has one (an image
    folder's resize), decoded by threads that each fill their share of one tensor (PIL decodes with the GIL
    released; one tensor, not a list stacked, so a large set takes its size once); a UserError naming a file that
    cannot be read or decoded, or images of several sizes."""
    paths, prepare = [path for path, _ in split.samples], getattr(split, "prepare", None)
    first = next((array for path in paths if not isinstance(array := image_files.pixels(path, prepare),
                                                            image_files.BadImage)), None)
    if first is None:  # not one image decodes
        raise UserError(image_files.describe(image_files.find_bad(paths)))
    height, width, channels = first.shape
    images = torch.empty(len(paths), channels, height, width, dtype=torch.uint8)
    count = max(1, min(os.cpu_count() or 1, len(paths)))

    def share(start: int) -> tuple[list[tuple[int, image_files.BadImage]], list[int]]:
        bad, odd = [], []
        for index in range(start, len(paths), count):
            array = image_files.pixels(paths[index], prepare)
            if isinstance(array, image_files.BadImage):
                bad.append((index, array))
            elif array.shape != first.shape:
                odd.append(index)
            else:
                images[index].numpy()[...] = array.transpose(2, 0, 1)  # PIL's pixels are read-only
        return bad, odd

    with ThreadPoolExecutor(max_workers=count) as pool:
        shares = list(pool.map(share, range(count)))
    bad = [image for _, image in sorted(found for part, _ in shares for found in part)]
    if bad:
        raise UserError(image_files.describe(bad))
    odd = sorted(index for _, part in shares for index in part)
    if odd:
        other = image_files.pixels(paths[odd[0]], prepare).shape
        raise UserError(f"the images under {split.root} are not all one size ({first.shape} and {other} (height, "
                        f"width, channels), e.g. {paths[odd[0]]}), and the data path that keeps them in memory needs "
                        f"one. Resize them, or pass --loader dataloader.")
    return images


def decode(split: Dataset) -> Decoded:
    """The split's images as uint8 (N, C, H, W) exactly as torchvision decodes them (PIL for image folders, then an
    image folder's resize); a file that cannot be read or decoded is named (UserError)."""
    if hasattr(split, "samples"):  # an image folder
        images, labels = _decode_files(split), torch.tensor(split.targets, dtype=torch.int64)
    elif hasattr(split, "train_list"):  # CIFAR10: the pickles hold (N, H, W, C) uint8 already
        images = torch.from_numpy(split.data).permute(0, 3, 1, 2).contiguous()
        labels = torch.tensor(split.targets, dtype=torch.int64)
    else:  # MNIST: (N, H, W) uint8
        images, labels = split.data.unsqueeze(1).contiguous(), split.targets.to(torch.int64)
    return Decoded(images, labels)


def cache_folder(data_dir: Path) -> Path:
    """Beside the data when that folder is writable, else under the user's cache (a read-only shared copy)."""
    if os.access(data_dir, os.W_OK):
        return data_dir / CACHE_FOLDER
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "mpi_train" / hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]


class Unusable(Exception):
    """A cache file that must be rebuilt, with why."""


def load(path: Path, expected: str | None = None) -> Decoded:
    """The cache file mapped into memory; Unusable if it cannot be read, is of another format or (with `expected`)
    was built from other sources."""
    try:
        held = torch.load(path, mmap=True, weights_only=True)
        images, labels = held["images"], held["labels"]
        consistent = images.dtype == torch.uint8 and images.dim() == 4 and labels.shape == images.shape[:1]
    except FileNotFoundError:
        raise Unusable("not built yet") from None
    except Exception as error:  # noqa: BLE001 - a truncated, foreign or corrupt file: all rebuilt the same way
        raise Unusable(f"unreadable ({type(error).__name__})") from None
    if held.get("format") != CACHE_FORMAT or not consistent:
        raise Unusable("of another format")
    if expected is not None and held.get("fingerprint") != expected:
        raise Unusable("made from other versions of its source files")
    return Decoded(images, labels)


def write_in_new_folder(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """write_atomically, making the folders `path` needs; if it fails, the folders it made are removed again (one
    that holds anything else by then stays): a failed write leaves no empty folder behind."""
    made = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]  # deepest first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, write)
    except BaseException:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def checked(path: Path, stamp: str) -> bool:
    """True if every image of the sources of fingerprint `stamp` decoded, as recorded beside the cache file `path`."""
    try:
        return path.with_suffix(CHECKED_SUFFIX).read_text() == stamp
    except (OSError, UnicodeDecodeError):  # not checked yet, or a record that cannot be trusted: checked again
        return False


def remember_checked(path: Path, stamp: str) -> bool:
    """Record beside the cache file `path` that every image of the sources of fingerprint `stamp` decoded; False if
    it cannot be written, which only costs the next job the same check."""
    try:
        write_in_new_folder(path.with_suffix(CHECKED_SUFFIX), lambda handle: handle.write(stamp.encode()))
    except OSError:
        return False
    return True


def unwritable(path: Path, cause: OSError) -> UserError:
    """The cache file could not be written: where, the system's reason, and the two ways on."""
    fix = "Free space on that disk" if cause.errno in FULL_DISK else f"Make {path.parent} writable"
    return UserError(f"the decoded copy {path} could not be written ({cause.strerror or cause}); nothing was kept. "
                     f"{fix}, or pass --loader dataloader to read the images as they are, without a decoded copy.")


def ensure(split: Dataset, path: Path, say: Callable[[str], None] = print) -> None:
    """Build `path` from `split` unless it holds the split's current decoding; a rebuild is said in one line. A file
    that cannot be decoded, and a copy that cannot be written, are told apart (UserError each)."""
    files = source_files(split)
    stamp = fingerprint(files)
    try:
        load(path, stamp)
        return
    except Unusable as why:
        reason = str(why)
    decoded = decode(split)
    payload = {"format": CACHE_FORMAT, "fingerprint": stamp, "images": decoded.images, "labels": decoded.labels}
    try:
        write_in_new_folder(path, lambda handle: torch.save(payload, handle))
    except Exception as error:  # torch wraps a full disk's OSError in its own RuntimeError
        cause = system_error(error)
        if cause is None:
            raise
        raise unwritable(path, cause) from None
    if hasattr(split, "samples"):  # every image decoded: the DataLoader path need not check them again
        remember_checked(path, stamp)
    verb = "decoded" if reason == "not built yet" else f"rebuilt (the cache was {reason}):"
    say(f"mpi_train: {verb} {len(decoded.labels):,} images of {len(files):,} file(s) once into {path} "
        f"({decoded.nbytes / 2**20:,.1f} MiB)")
