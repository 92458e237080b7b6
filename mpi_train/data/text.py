"""Text for a language model: the bytes of any UTF-8 text file (or folder of them), or synthetic words, held on
the rank's device as one uint8 tensor per split; batches are random windows of the context's length.

The vocabulary is the 256 byte values, so there is no tokenizer to download. The first 90% of the bytes train, the
last 10% validate (as nanoGPT splits its shakespeare-char). Each rank draws its own windows, from a generator seeded
by (seed, rank, epoch, micro-batch of the epoch), i.e. by (seed, rank, step): a resumed job draws exactly the windows
the uninterrupted one did. An epoch is as many steps as put the training split's bytes through the model once in
expectation: train bytes // (global batch x context), at least one.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from .folders import reached_twice

TRAIN_SHARE = 0.9
VALIDATION_BYTES = 2**18  # at most this much of the held-out split is scored at each evaluation (the first bytes)
SYNTHETIC_TEXT_SEED = 4321  # fixed, so synthetic text is the same whatever --seed says
SYNTHETIC_WORDS, SYNTHETIC_LETTERS = 512, "etaoinshrdlucmfwypvbgkjqxz"
SYNTHETIC_SLICE = 1 << 20  # words laid out at once: bounds the index arrays to some tens of MB
# A file is said not to look like text when more than this share of its bytes is not text: text in another 8-bit
# encoding stays below (Latin-1 with an accent in every seventh letter: 15%), compressed or binary data well above
# (random bytes: about 52%, programs and archives 54-64%, MNIST's IDX files 95%)
NOT_TEXT_SHARE = 0.3
TEXT_SAMPLE_BYTES = 2**20  # the share is measured on each file's first MiB: a warning needs no more
TEXT_CONTROLS = (9, 10, 12, 13)  # tab, line feed, form feed, carriage return: the control bytes text holds


class TextSplit:
    """One split's bytes as a uint8 tensor (on the CPU until the loader moves it to the device)."""

    def __init__(self, data: torch.Tensor, source: str):
        self.data, self.source = data, source

    def __len__(self) -> int:
        return len(self.data)


def read_files(root: Path) -> list[tuple[Path, bytes]]:
    """Each file of `root` and its bytes: root itself, or every file under a folder (in sorted order, hidden ones
    left out)."""
    if root.is_file():
        return [(root, root.read_bytes())]
    if not root.is_dir():
        what = "is neither a file nor a folder (a pipe or a device)" if root.exists() else "does not exist"
        raise UserError(f"--dataset text reads the text file or folder at --data-dir, and {root} {what}. Point "
                        f"--data-dir at a UTF-8 text file or a folder of them, or use --dataset synthetic.")
    files = text_files(root)
    if not files:
        raise UserError(f"--dataset text reads every file under the folder --data-dir {root}, and it holds none"
                        f"{' but hidden ones' if any(root.rglob('*')) else ''}. Put UTF-8 text files in it, point "
                        f"--data-dir at one file, or use --dataset synthetic.")
    return [(path, path.read_bytes()) for path in files]


def text_files(root: Path) -> list[Path]:
    """Every file under the folder `root`, sorted, hidden ones left out, through links as imagefolder goes (a
    folder of links to the books is a corpus too); a UserError for a link that loops or leads to nothing, whose files
    would be read twice or silently missed."""
    if twice := reached_twice(root):
        raise UserError(f"{twice[1]} is {twice[0]} again, reached through a link (a link to a folder above it "
                        f"loops): its files would be read more than once. Remove the link, or copy what it leads to.")
    found, broken = [], []
    for here, folders, names in os.walk(root, followlinks=True):
        folders[:] = [name for name in folders if not name.startswith(".")]
        for path in (Path(here) / name for name in names if not name.startswith(".")):
            if path.is_file():
                found.append(path)
            elif path.is_symlink() and not path.exists():
                broken.append(path)
    if broken:
        raise UserError(f"{root} holds {len(broken):,} link(s) to no file ({broken[0]} leads to "
                        f"{os.readlink(broken[0])}, which does not exist): their text would be left out. Remove "
                        f"them, or restore what they lead to.")
    return sorted(found)


def read_bytes(root: Path) -> bytes:
    """The bytes of `root`, a file, or every file under a folder, one after the other (`read_files`)."""
    return b"".join(data for _, data in read_files(root))


def not_text_share(data: bytes) -> float:
    """The share of `data`'s bytes (of its first MiB) that are not text: outside any valid UTF-8 sequence, or control
    bytes other than the few text holds."""
    sample = data[:TEXT_SAMPLE_BYTES]
    if not sample:
        return 0.0
    replaced = "\ufffd"
    invalid = sample.decode("utf-8", errors="replace").count(replaced) - sample.count(replaced.encode())
    values = np.frombuffer(sample, dtype=np.uint8)
    controls = np.count_nonzero(((values < 32) & ~np.isin(values, TEXT_CONTROLS)) | (values == 127))
    return min(1.0, (invalid + int(controls)) / len(sample))


def not_text_warning(files: list[tuple[Path, bytes]]) -> str | None:
    """One line naming the file that least looks like text, if any does not (training goes on: any bytes train a
    byte-level model, but binary data is seldom what was meant)."""
    shares = sorted(((share, str(path)) for path, data in files if (share := not_text_share(data)) > NOT_TEXT_SHARE),
                    reverse=True)
    if not shares:
        return None
    share, path = shares[0]
    others = f" (and {len(shares) - 1:,} more file(s) like it)" if len(shares) > 1 else ""
    return (f"{path} does not look like text: {share:.0%} of its bytes are not UTF-8 text (invalid UTF-8 or control "
            f"bytes){others}. --dataset text trains on its bytes all the same.")


def synthetic_text(size: int) -> bytes:
    """`size` bytes of made-up words: a fixed vocabulary of random words drawn at random, so the next byte is
    predictable inside a word and not across words (a loss that falls, but not to zero). The words are laid end to
    end by index arithmetic, a slice of picks at a time: joined as Python bytes they took about 50 times the text's
    size and 4 s for 30 MB, which a long --context asks for."""
    draw = np.random.default_rng(SYNTHETIC_TEXT_SEED)
    letters = np.frombuffer(SYNTHETIC_LETTERS.encode(), dtype=np.uint8)
    words = [letters[draw.integers(0, len(letters), draw.integers(2, 9))].tobytes() for _ in range(SYNTHETIC_WORDS)]
    picks = draw.integers(0, SYNTHETIC_WORDS, size // 3 + 1)  # at least `size` bytes: each word and its space take 3
    spaced = np.frombuffer(b"".join(word + b" " for word in words), dtype=np.uint8)
    lengths = np.array([len(word) + 1 for word in words])
    starts = np.cumsum(lengths) - lengths
    out, made = bytearray(), 0
    for first in range(0, len(picks), SYNTHETIC_SLICE):
        taken = picks[first:first + SYNTHETIC_SLICE]
        spans = lengths[taken]
        ends = np.cumsum(spans)  # each pick's bytes follow the last's: byte j of pick k is spaced[starts[k] + j]
        index = np.repeat(starts[taken] - (ends - spans), spans) + np.arange(ends[-1])
        out += spaced[index].tobytes()
        made += int(ends[-1])
        if made >= size:
            break
    return bytes(out[:size])


def splits(data: bytes, context: int, source: str) -> tuple[TextSplit, TextSplit]:
    """(train, validation): the first 90% and the last 10% of the bytes; each must hold a window and its next byte."""
    cut = int(TRAIN_SHARE * len(data))
    train, validation = data[:cut], data[cut:]
    if len(validation) < context + 1:
        raise UserError(f"{source} holds {len(data):,} bytes, too few for --context {context}: its last 10% "
                        f"({len(validation):,} bytes) must hold a window of {context} bytes and the next one, so it "
                        f"needs at least {round((context + 1) / (1 - TRAIN_SHARE)):,}. Use more text or a "
                        f"shorter --context.")
    as_tensor = lambda part: torch.from_numpy(np.frombuffer(part, dtype=np.uint8).copy())
    return TextSplit(as_tensor(train), source), TextSplit(as_tensor(validation), source)


def window_seed(seed: int, epoch: int, step: int) -> int:
    """A 63-bit seed of its own for each (seed, epoch, optimizer step of the epoch)."""
    return int(np.random.SeedSequence([seed, epoch, step]).generate_state(2, dtype=np.uint64)[0] >> 1)


def windows(data: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The windows of `data` starting at `starts`: tokens (batch, context) and the next bytes, flattened."""
    where = starts[:, None] + torch.arange(context + 1, device=data.device)
    chunk = data[where].long()
    return chunk[:, :-1], chunk[:, 1:].reshape(-1)


def zero_windows(batch: int, context: int, device: torch.device) -> torch.Tensor:
    """Tokens of zeros laid out as a batch of windows() is (views one token narrower than their rows): what a compiled
    model's warm-up feeds it, since its graphs hold for their inputs' strides."""
    data, starts = torch.zeros(context + 1, dtype=torch.uint8, device=device), torch.zeros(batch, dtype=torch.int64)
    return windows(data, starts.to(device), context)[0]


class WindowSampler:
    """train.py's sampler for text: the epoch, and where a resumed epoch starts (in samples of the rank)."""

    def __init__(self, samples_per_epoch: int):
        self.samples_per_epoch, self.epoch, self.skip = samples_per_epoch, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip_next(self, samples: int) -> None:
        self.skip = samples

    def next_pass(self) -> int:
        start, self.skip = self.skip, 0
        return start

    def __len__(self) -> int:
        return self.samples_per_epoch


class TextTrainLoader:
    """The rank's training windows of one epoch: `batches` micro-batches of `batch_size` random windows each. Each
    optimizer step draws its global batch of windows from a seed of its own, and each rank trains on its share of
    them, `accumulate` micro-batches in turn: a step trains on the same windows on any number of ranks (--reshard)
    and at any --accumulate, as the image samplers' steps do."""

    def __init__(self, split: TextSplit, device: torch.device, context: int, batch_size: int, batches: int,
                 seed: int, rank: int, world_size: int = 1, accumulate: int = 1):
        self.data, self.context, self.batch_size, self.batches = split.data.to(device), context, batch_size, batches
        self.seed, self.rank, self.world_size, self.accumulate = seed, rank, world_size, accumulate
        self.sampler = WindowSampler(batches * batch_size)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        first = self.sampler.next_pass() // self.batch_size  # a resumed epoch: the micro-batches already trained on
        share = self.batch_size * self.accumulate  # the rank's windows of a step
        drawn = None
        for batch in range(first, self.batches):
            step, micro = divmod(batch, self.accumulate)
            if drawn is None or drawn[0] != step:
                generator = torch.Generator().manual_seed(window_seed(self.seed, self.sampler.epoch, step))
                drawn = step, torch.randint(0, len(self.data) - self.context, (share * self.world_size,),
                                            generator=generator)
            begin = self.rank * share + micro * self.batch_size
            yield windows(self.data, drawn[1][begin:begin + self.batch_size].to(self.data.device), self.context)


class TextTestLoader:
    """The rank's share of the validation split: consecutive windows (each scored by exactly one rank), in order."""

    def __init__(self, split: TextSplit, device: torch.device, context: int, batch_size: int, rank: int,
                 world_size: int):
        self.data = split.data[:VALIDATION_BYTES + 1].to(device)
        self.context, self.batch_size = context, batch_size
        count = (len(self.data) - 1) // context
        self.starts = torch.arange(rank, count, world_size, device=device) * context

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def __len__(self) -> int:
        return math.ceil(len(self.starts) / self.batch_size)

    def __iter__(self):
        for first in range(0, len(self.starts), self.batch_size):
            yield windows(self.data, self.starts[first:first + self.batch_size], self.context)
