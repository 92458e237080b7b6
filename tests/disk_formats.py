"""Tiny data sets written in the real on-disk formats, so torchvision's own readers are exercised."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
from PIL import Image

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _images(count: int, shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class-dependent uint8 images (a brightness level per class plus noise) and their labels."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 10
    base = (labels * 25).reshape(-1, *([1] * len(shape)))
    noise = rng.integers(0, 20, size=(count, *shape))
    return np.clip(base + noise, 0, 255).astype(np.uint8), labels.astype(np.uint8)


def write_mnist(root: Path, train: int = 256, test: int = 64) -> Path:
    """root/MNIST/raw with the four IDX files torchvision.datasets.MNIST reads."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, count, seed in (("train", train, 0), ("t10k", test, 1)):
        images, labels = _images(count, (28, 28), seed)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, count, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, count) + labels.tobytes())
    return root


def write_cifar10_folders(root: Path, train: int = 256, test: int = 64) -> Path:
    """root/train/<class>/*.png and root/test/<class>/*.png, the image-folder layout."""
    for split, count, seed in (("train", train, 0), ("test", test, 1)):
        images, labels = _images(count, (32, 32, 3), seed)
        for index, (image, label) in enumerate(zip(images, labels)):
            folder = root / split / CIFAR10_CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{index:05d}.png")
    return root


def write_cifar10_batches(root: Path, per_batch: int = 20) -> Path:
    """root/cifar-10-batches-py, the official python pickles (five training batches and one test batch)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for seed, name in enumerate(names):
        images, labels = _images(per_batch, (3, 32, 32), seed)
        batch = {"data": images.reshape(per_batch, -1), "labels": labels.tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": CIFAR10_CLASSES}))
    return root


def damage_an_image(root: Path, split: str = "train", jpegs: int = 3) -> Path:
    """In an image folder of PNGs: `jpegs` of them saved again as JPEGs, and one more replaced by a JPEG of random
    bytes, as an interrupted copy or a failing disk leaves one; that file's path."""
    pngs = sorted((root / split).rglob("*.png"))[:jpegs + 1]
    for png in pngs[:jpegs]:
        Image.open(png).save(png.with_suffix(".jpg"), quality=95)
        png.unlink()
    damaged = pngs[jpegs].with_suffix(".jpg")
    damaged.write_bytes(np.random.default_rng(7).integers(0, 256, 1500, dtype=np.uint8).tobytes())
    pngs[jpegs].unlink()
    return damaged


# (file format, PIL mode, (width, height)) in turn: what an image folder gathered from anywhere holds
MIXED_IMAGES = (("JPEG", "RGB", (48, 40)), ("PNG", "L", (30, 52)), ("PNG", "RGBA", (64, 64)), ("JPEG", "L", (90, 70)),
                ("PNG", "P", (37, 37)), ("PNG", "RGB", (120, 33)))


def write_image_folder(root: Path, classes: int = 5, train: int = 4, evaluation: int = 2,
                       evaluation_folder: str = "val") -> Path:
    """root/train/<class>/* and root/<evaluation_folder>/<class>/*, ImageNet's layout: per class `train` and
    `evaluation` images of mixed sizes, formats and modes (RGB and greyscale JPEGs; greyscale, RGBA, palette and RGB
    PNGs), a brightness level per class plus noise."""
    rng = np.random.default_rng(0)
    for split, count in (("train", train), (evaluation_folder, evaluation)):
        for label in range(classes):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                kind, mode, (width, height) = MIXED_IMAGES[(label + index) % len(MIXED_IMAGES)]
                pixels = np.clip(label * 50 + rng.integers(0, 40, (height, width, 3)), 0, 255).astype(np.uint8)
                image = Image.fromarray(pixels).convert(mode)
                if mode == "RGBA":
                    image.putalpha(160)
                image.save(folder / f"{index:03d}.{'jpg' if kind == 'JPEG' else 'png'}", kind)
    return root
