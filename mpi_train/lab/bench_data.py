"""`python -m mpi_train bench-data`: the two data paths side by side, training images per second on one thread.

    python -m mpi_train bench-data --data-dir data
    python -m mpi_train bench-data --dataset imagefolder --image-size 64 --data-dir DIR

The image-folder (or pickle) reader through torch's DataLoader, with torchvision's transforms per image (CIFAR-10:
RandomCrop, flip; an image folder: decoding, the resize to the stored square, RandomResizedCrop, flip; then ToTensor
and Normalize), against the resident path's whole-batch augmentation of the decoded split (data/), both serving
the training batches in the same seeded order on the same CPU threads. Also timed: decoding the split into its
cache (or finding it fresh) and mapping the cache into memory, what a job pays before its first step. No process
group, no model: only the data path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ..config import TrainConfig
from ..data import cache, folders
from ..data.loaders import NORMALISATION, cache_name, view
from ..data.resident import ResidentSplit, ResidentTrainLoader
from ..data.sampler import ResumableSampler
from ..data.sets import _open_cifar10, image_size
from ..errors import ArgumentParser, UserError, format_error

TITLES = {"cifar10": "CIFAR-10", "imagefolder": "image folder"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(prog="python -m mpi_train bench-data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="CIFAR-10: an image folder (train/<class>/*) or "
                        "cifar-10-batches-py/; imagefolder: train/<class>/* and val/<class>/* (or test/)")
    parser.add_argument("--dataset", choices=tuple(TITLES), default="cifar10", help="the data set and its "
                        "augmentation, as training reads it (default: cifar10)")
    parser.add_argument("--image-size", type=int, help="--dataset imagefolder: the size trained on, as training's "
                        f"--image-size (default: {folders.DEFAULT_IMAGE_SIZE})")
    parser.add_argument("--batch-size", type=int, default=256, help="images per batch (default: 256)")
    parser.add_argument("--batches", type=int, default=40, help="batches the DataLoader path is timed over (default: "
                        "40; the resident path takes a whole epoch)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for both paths (default: 1)")
    parser.add_argument("--json", help="also write the figures here")
    return parser.parse_args(argv)


def timed_pass(batches, limit: int | None = None) -> tuple[int, float]:
    """Images served and seconds taken over `limit` batches (all when None)."""
    started, images = time.perf_counter(), 0
    for number, (batch, _labels) in enumerate(batches, 1):
        images += len(batch)
        if limit and number >= limit:
            break
    return images, time.perf_counter() - started


def measure(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    root, cpu = Path(args.data_dir), torch.device("cpu")
    config = TrainConfig(dataset=args.dataset, data_dir=str(root), image_size=args.image_size)
    if args.dataset == "imagefolder":
        split = folders.open_splits(root, image_size(config))[0]
    else:
        split = _open_cifar10(root, train=True)
    sampler = ResumableSampler(split, num_replicas=1, rank=0, shuffle=True, seed=42)

    path = cache.cache_folder(root) / cache_name(config, split)  # the one jobs use
    began = time.perf_counter()
    cache.ensure(split, path)
    prepared_s = time.perf_counter() - began
    began = time.perf_counter()
    decoded = cache.load(path)
    resident = ResidentSplit(images=decoded.images, labels=decoded.labels, device=cpu,
                             normalise=NORMALISATION[args.dataset],
                             view=view(config, decoded.images.shape[-1], cpu, train=True))
    mapped_s = time.perf_counter() - began
    resident_images, resident_s = timed_pass(ResidentTrainLoader(split=resident, sampler=sampler,
                                                                 batch_size=args.batch_size, seed=42, rank=0))

    loader = DataLoader(split, batch_size=args.batch_size, sampler=sampler, num_workers=0)
    folder_images, folder_s = timed_pass(loader, args.batches)
    return {
        "data_dir": str(root.resolve()), "dataset": args.dataset, "stored_size": decoded.images.shape[-1],
        "image_size": image_size(config) if args.dataset == "imagefolder" else decoded.images.shape[-1],
        "threads": args.threads, "batch_size": args.batch_size,
        "reader": type(split).__name__, "cache": str(path), "cache_prepare_s": prepared_s, "cache_map_s": mapped_s,
        "resident_images": resident_images, "resident_images_per_s": resident_images / resident_s,
        "dataloader_images": folder_images, "dataloader_images_per_s": folder_images / folder_s,
        "speedup": (resident_images / resident_s) / (folder_images / folder_s),
        "torch": torch.__version__,
    }


def table(figures: dict) -> str:
    rows = [("DataLoader, " + figures["reader"] + " + torchvision transforms", figures["dataloader_images"],
             figures["dataloader_images_per_s"]),
            ("resident, whole-batch augmentation", figures["resident_images"], figures["resident_images_per_s"])]
    batch = figures["batch_size"]
    size, kept = figures["image_size"], figures["stored_size"]
    title = (f"{TITLES[figures['dataset']]} training batches of {batch} at {size}x{size} (kept at {kept}x{kept}), "
             f"augmented, {figures['threads']} CPU thread(s):")
    lines = [title,
             f"  {'data path':<52} {'images':>8} {'images/s':>10} {f'ms/{batch}':>8}"]
    lines += [f"  {name:<52} {count:>8,} {rate:>10,.0f} {1e3 * batch / rate:>8.2f}" for name, count, rate in rows]
    lines.append(f"  resident / DataLoader: {figures['speedup']:.1f}x; the cache took "
                 f"{figures['cache_prepare_s']:.1f} s to decode or check, {figures['cache_map_s'] * 1e3:.0f} ms to map")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        figures = measure(args)
    except UserError as error:
        print(format_error(str(error), "mpi_train bench-data"), file=sys.stderr)
        return 2
    print(table(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0
