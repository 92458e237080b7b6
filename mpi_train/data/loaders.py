"""Which data path a job runs, and its loaders: the split resident on the device, or torch's DataLoader.

`--loader resident` holds the decoded split where the model computes and prepares whole batches there
(resident.py); `--loader dataloader` reads samples one by one through torchvision's transforms, with worker
processes and pinned memory on CUDA, for data that does not fit; `auto` (the default) takes the resident path
whenever the data set fits in half the device's free memory (CIFAR-10 takes 176 MiB per rank, MNIST 52; an image
folder what its images take at --image-size x 8/7), and says so when it does not. A data set of the user's own
always takes the DataLoader path: its transforms are the user's code, run per sample. Both paths follow the same
seeded sampler, so every step trains on the same samples whichever path runs. Either path names an image that
cannot be decoded before the first step: the resident path decodes every image to build its cache, the DataLoader
path decodes each once per version of the files (`check_images`), and a file that goes bad (or a user's item that
raises) during the job is named by the batch that meets it, not by a worker's traceback.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset, default_collate

from ..cluster import Cluster
from ..config import DATASET_SHAPES, TrainConfig
from ..errors import UserError
from ..models.user import is_path as is_users
from . import cache, folders, images, text
from . import user as user_data
from .augment import CentreCrop, CropFlip, ResizedCropFlip
from .resident import ResidentSplit, ResidentTestLoader, ResidentTrainLoader
from .sampler import ResumableSampler
from .sets import CIFAR10_MEAN, CIFAR10_STD, MNIST_MEAN, MNIST_STD, SyntheticImages, image_size

NORMALISATION = {"cifar10": (CIFAR10_MEAN, CIFAR10_STD), "mnist": (MNIST_MEAN, MNIST_STD),
                 "imagefolder": (folders.IMAGENET_MEAN, folders.IMAGENET_STD)}
AUGMENTED = ("cifar10", "imagefolder")  # random crops and flips on training batches
RESIDENT_SHARE = 0.5  # auto holds a data set resident when it takes at most this share of the device's free memory
MAX_WORKERS = 8  # the DataLoader path's worker processes per rank on CUDA, at most


@dataclass(frozen=True)
class Loaders:
    """A job's training batches, their sampler, its test shard, and what the data path holds per rank."""

    train: Any
    sampler: ResumableSampler
    test: Any
    path: str  # "resident" or "dataloader"
    batch_sizes: tuple[set[int], set[int]]  # (training's, testing's): the full batch and a smaller last one
    resident_bytes: int = 0  # what the resident path holds on the rank's device (0: the DataLoader path)

    def describe(self) -> str:
        if self.path == "resident":
            return f"resident, {self.resident_bytes / 2**20:,.1f} MiB per rank"
        return f"DataLoader, {getattr(self.train, 'num_workers', 0)} worker(s)"


def cache_name(config: TrainConfig, split: Dataset) -> str:
    """The split's cache file: one per data set, layout and split (CIFAR-10's two layouts decode apart), and for an
    image folder per size its images are kept at."""
    if config.dataset == "imagefolder":
        return f"imagefolder-{Path(split.root).name}-{split.stored}px.pt"
    if hasattr(split, "samples"):  # CIFAR-10's image folder: its folder says which split it is
        return f"{config.dataset}-folder-{Path(split.root).name}.pt"
    return f"{config.dataset}-{'train' if split.train else 'test'}.pt"


def decoded_split(config: TrainConfig, split: Dataset, cluster: Cluster) -> cache.Decoded:
    """The split as uint8 tensors from its cache file, built (or rebuilt) once per host first. Collective."""
    path = cache.cache_folder(Path(config.data_dir)) / cache_name(config, split)
    cluster.run_per_host(lambda: cache.ensure(split, path),
                         f"cannot prepare {config.dataset} for the resident data path")
    decoded, outcome = None, None
    try:
        decoded = cache.load(path)
    except cache.Unusable as why:  # this rank's alone, maybe: shared, so that no rank waits for it in a collective
        outcome = (f"the decoded copy {path} of {config.dataset} is {why} right after it was built: another job may "
                   f"be rewriting it. Run again, or pass --loader dataloader.")
    cluster.agree(outcome, f"cannot prepare {config.dataset} for the resident data path")
    return decoded


def view(config: TrainConfig, side: int, device: torch.device, train: bool):
    """What a batch of the split takes before its normalisation (augment.py): CIFAR-10's crop and flip to train, an
    image folder's random resized crop and flip to train and centre crop to evaluate; None: the images as held."""
    if config.dataset == "imagefolder":
        size = image_size(config)
        return ResizedCropFlip(size, side, device) if train else CentreCrop(size, side)
    return CropFlip(side, device) if train and config.dataset in AUGMENTED else None


def resident_split(config: TrainConfig, split: Dataset, cluster: Cluster, device: torch.device,
                   train: bool) -> ResidentSplit:
    if isinstance(split, SyntheticImages):  # made in memory already, as float
        return ResidentSplit(split.images, split.labels, device, None)
    decoded = decoded_split(config, split, cluster)
    return ResidentSplit(images=decoded.images, labels=decoded.labels, device=device,
                         normalise=NORMALISATION[config.dataset],
                         view=view(config, decoded.images.shape[-1], device, train))


def check_images(config: TrainConfig, split: Dataset, cluster: Cluster) -> None:
    """Decode every image of an image-folder split before the DataLoader path's first step, so that a damaged file is
    named before training rather than by a worker mid-epoch. The verdict is kept beside the decoded cache under the
    files' fingerprint: a later job pays one stat per file, not a decoding of all (and a resident build that decoded
    them leaves the same verdict). The host's ranks share the decoding. Collective."""
    if not hasattr(split, "samples"):  # CIFAR-10's pickles and MNIST's IDX files (read whole when opened), or the
        return  # user's own data set, whose items are the user's code
    info = cluster.info
    path = cache.cache_folder(Path(config.data_dir)) / cache_name(config, split)
    files = [str(file) for file in cache.source_files(split)]
    stamp = cache.fingerprint([Path(file) for file in files])
    fresh, outcome, started = cache.checked(path, stamp), None, time.perf_counter()
    if not fresh:
        threads = max(1, (os.cpu_count() or 1) // info.local_world_size)
        bad = images.find_bad(files[info.local_rank::info.local_world_size], threads)
        outcome = images.describe(bad) if bad else None
    cluster.agree(outcome, f"cannot read {config.dataset}")
    if not fresh and info.local_rank == 0:
        kept = cache.remember_checked(path, stamp)
        print(f"mpi_train: checked that the {len(files):,} images under {split.root} decode "
              f"({time.perf_counter() - started:.1f} s, " +
              ("once per version of the files)" if kept else f"again next time: {path.parent} is not writable)"))


class NamedFaults(Dataset):
    """An image folder whose unreadable or undecodable file comes out as its BadImage in place of the sample: raised
    in a DataLoader worker, it would come back as torch's own error with the worker's traceback in its text."""

    def __init__(self, split: Dataset):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int):
        try:
            return self.split[index]
        except images.BadImage as bad:
            return bad


FAULTS = (images.BadImage, user_data.BadSample)  # a sample that stands for its fault, named by the batch


def collate(samples: list):
    """A batch, or the fault of its first damaged sample (an image that cannot be decoded, a user's item that
    raised)."""
    bad = next((sample for sample in samples if isinstance(sample, FAULTS)), None)
    return bad if bad is not None else default_collate(samples)


class Batches(DataLoader):
    """torch's DataLoader whose batches stop at a damaged image with its paragraph (on this rank alone: the job is
    ended, as for any fault one rank meets)."""

    def __init__(self, dataset: Dataset, **options):
        super().__init__(dataset, collate_fn=collate, **options)

    def __iter__(self):
        # torch's iterator is made here, not at the first batch: making it draws a seed from torch's random stream,
        # and a resumed job restores that stream right after iter()
        return self._named(super().__iter__())

    @staticmethod
    def _named(batches):
        for batch in batches:
            if isinstance(batch, FAULTS):
                raise UserError(str(batch), collective=False)
            yield batch


def held_bytes(config: TrainConfig, splits: tuple[Dataset, Dataset]) -> int:
    """What the resident path would hold per rank, before anything is decoded."""
    if config.dataset == "synthetic":
        return sum(split.images.nbytes + split.labels.nbytes for split in splits)
    if config.dataset == "imagefolder":
        channels, height, width = 3, splits[0].stored, splits[0].stored
    else:
        channels, height, width = DATASET_SHAPES[config.dataset]
    return sum(len(split) * (channels * height * width + 8) for split in splits)


def free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil  # here, not at the top: only the auto choice on CPUs needs it

    return psutil.virtual_memory().available


def choose(config: TrainConfig, splits: tuple[Dataset, Dataset], device: torch.device) -> tuple[str, str | None]:
    """The data path --loader names; auto: resident when it fits in its share of the device's free memory. With it,
    why auto did not take the resident path (None: it did, or --loader chose)."""
    if is_users(config.dataset):
        if config.loader == "resident":
            raise UserError(f"--loader resident holds a decoded copy of a data set this tool reads, and --dataset "
                            f"{config.dataset} is your own, whose items your code makes one by one (its transforms "
                            f"included). Drop --loader: it is read through torch's DataLoader.")
        return "dataloader", None
    if config.loader != "auto":
        return config.loader, None
    held, free = held_bytes(config, splits), free_bytes(device)
    if held <= RESIDENT_SHARE * free:
        return "resident", None
    size = f" at --image-size {image_size(config)}" if config.dataset == "imagefolder" else ""
    return "dataloader", (f"{config.dataset}{size} would take {held / 2**20:,.1f} MiB per rank held decoded, more "
                          f"than half of the {free / 2**20:,.1f} MiB free on {device}")


def workers(config: TrainConfig, device: torch.device, threads: int) -> int:
    """--loader-workers, else none on CPUs (the ranks use every core already) and up to 8 on CUDA."""
    if config.loader_workers is not None:
        return config.loader_workers
    return min(MAX_WORKERS, threads) if device.type == "cuda" else 0


def text_loaders(train: text.TextSplit, test: text.TextSplit, config: TrainConfig, cluster: Cluster,
                 device: torch.device) -> Loaders:
    """Random windows for training, the validation split's consecutive windows for scoring (text.py)."""
    info, context = cluster.info, config.gpt_shape.context
    micro_batch = config.micro_batch(info.world_size)
    steps = max(1, len(train) // (config.batch_size * context))  # an epoch: the training bytes once, in expectation
    loader = text.TextTrainLoader(split=train, device=device, context=context, batch_size=micro_batch,
                                  batches=steps * config.accumulate, seed=config.seed, rank=info.rank,
                                  world_size=info.world_size, accumulate=config.accumulate)
    test_batch = config.per_rank(info.world_size)
    scored = text.TextTestLoader(split=test, device=device, context=context, batch_size=test_batch, rank=info.rank,
                                 world_size=info.world_size)
    sizes = ({micro_batch}, {len(scored.starts) % test_batch or test_batch, test_batch} - {0})
    return Loaders(train=loader, sampler=loader.sampler, test=scored, path="resident", batch_sizes=sizes,
                   resident_bytes=loader.nbytes + scored.nbytes)


def make_loaders(train: Dataset, test: Dataset, config: TrainConfig, cluster: Cluster, device: torch.device,
                 threads: int = 1) -> Loaders:
    """Non-overlapping shards: a seeded sampler for training, a strided slice for testing; on the path `choose`
    takes. The test shard is not padded (DistributedSampler pads by repeating samples), so the accuracy reduced
    over ranks counts each test image exactly once. Collective (the resident path's cache is built per host)."""
    if isinstance(train, text.TextSplit):  # bytes: always resident, a uint8 tensor per split
        return text_loaders(train, test, config, cluster, device)
    info = cluster.info
    micro_batch, test_batch = config.micro_batch(info.world_size), max(config.per_rank(info.world_size), 256)
    sampler = ResumableSampler(train, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=config.seed,
                               batch_size=micro_batch)
    if sampler.left_out and len(sampler) and info.is_main:  # none left: setup refuses the job
        print(f"mpi_train: each pass's last batch would hold 1 sample per rank ({len(train):,} training samples "
              f"over {info.world_size} rank(s), {micro_batch} a batch): it is left out, as BatchNorm cannot train "
              f"on one.", flush=True)
    shard = range(info.rank, len(test), info.world_size)
    sizes = tuple({batch, samples % batch or batch} for samples, batch in ((len(sampler), micro_batch),
                                                                           (len(shard), test_batch)))
    path, why = choose(config, (train, test), device)
    chosen = cluster.allgather((path, why))
    if any(other != path for other, _ in chosen):  # auto may see different free memory on each rank
        path, why = "dataloader", next(reason for _, reason in chosen if reason)
    if path == "resident":
        train_split = resident_split(config, train, cluster, device, train=True)
        test_split = resident_split(config, test, cluster, device, train=False)
        train_loader = ResidentTrainLoader(split=train_split, sampler=sampler, batch_size=micro_batch,
                                           seed=config.seed, rank=info.rank)
        test_loader = ResidentTestLoader(test_split, info.rank, info.world_size, test_batch)
        return Loaders(train=train_loader, sampler=sampler, test=test_loader, path=path, batch_sizes=sizes,
                       resident_bytes=train_split.nbytes + test_split.nbytes)
    count = workers(config, device, threads)
    if why and info.is_main:
        print(f"mpi_train: {why}: it is read through torch's DataLoader instead (--loader auto), with {count} "
              f"worker process(es) per rank" + (" (--loader-workers N for more)" if device.type != "cuda" else "")
              + (". A smaller --image-size holds it resident." if config.dataset == "imagefolder" else "."),
              flush=True)
    for split in (train, test):
        check_images(config, split, cluster)
    options = {"num_workers": count, "pin_memory": device.type == "cuda", "persistent_workers": count > 0}
    named = lambda split: NamedFaults(split) if hasattr(split, "samples") else split
    return Loaders(train=Batches(named(train), batch_size=micro_batch, sampler=sampler, **options), sampler=sampler,
                   test=Batches(Subset(named(test), shard), batch_size=test_batch, **options), path=path,
                   batch_sizes=sizes)
