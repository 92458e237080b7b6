"""Where each fault of `python -m mpi_train soak --bad-input` is set up: a fresh folder a case works in (its
Workspace), the jobs several cases start from (Setups), and what a case is (Case)."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from .bad_input_judge import Run, launch, message

DISK = "22m"  # the full disk's size
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# checkpoints written at the default global batch (256), so that --reshard on 3 ranks meets a batch it cannot split
RESUMABLE = ("--dataset", "synthetic", "--synthetic-size", "1024", "--model", "mnist_cnn", "--log-every", "1",
             "--timeout", "30", "--no-tracking", "--checkpoint-dir", "ck")


class NotRunnable(Exception):
    """A case whose fault could not be set up here (not root, a setup job that failed): why."""


class Setups:
    """Jobs several cases start from (a checkpoint folder per optimizer), each run once, when a case first needs it."""

    def __init__(self, root: Path):
        self.root, self.done = root, {}
        self.locks = {optimizer: threading.Lock() for optimizer in ("sgd", "adamw")}  # cases run side by side

    def checkpoints(self, optimizer: str) -> Path:
        with self.locks[optimizer]:
            return self._checkpoints(optimizer)

    def _checkpoints(self, optimizer: str) -> Path:
        if optimizer not in self.done:
            folder = self.root / f"setup-{optimizer}"
            folder.mkdir()
            (folder / "hostfile").write_text("localhost slots=2\n")
            flags = () if optimizer == "sgd" else ("--optimizer", optimizer)  # sgd: the model's own
            run = launch(mpirun_line(*RESUMABLE, "--max-steps", "3", "--checkpoint-every", "1", *flags), folder, 180)
            self.done[optimizer] = (folder / "ck", None if run.exit == 0 else
                                    f"its setup job failed (exit {run.exit}): {message(run.output)[:100]}")
        found, failed = self.done[optimizer]
        if failed:
            raise NotRunnable(failed)
        return found


def mpirun_line(*flags: str, np: int = 2) -> list[str]:
    return ["mpirun", "--bind-to", "none", "-np", str(np), "--hostfile", "hostfile", sys.executable, "-m",
            "mpi_train", *flags]


class Workspace:
    """A case's fresh folder, and what its faults are made with."""

    def __init__(self, folder: Path, aside: Path, stack: ExitStack, setups: Setups):
        self.folder, self.aside, self.stack, self.setups = folder, aside, stack, setups
        self.damaged: dict[Path, bytes] = {}  # files the case broke on purpose (not half-written), and their hash
        self.kept = b""  # what the case's own check looks for on disk afterwards
        self.rng = random.Random(folder.name)

    def train(self, *flags: str, np: int = 2) -> list[str]:
        (self.folder / "hostfile").write_text(f"localhost slots={max(2, np)}\n")
        return mpirun_line(*flags, np=np)

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "mpi_train", *args]

    def checkpoints(self, optimizer: str) -> Path:
        """A copy of the setup job's checkpoints (steps 1-3, global batch 256) as ck/."""
        return Path(shutil.copytree(self.setups.checkpoints(optimizer), self.folder / "ck"))

    def garbage(self, path: Path, size: int) -> Path:
        """`path` overwritten with `size` random bytes, and left out of the half-written check."""
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.rng.randbytes(size)
        path.write_bytes(data)
        self.damaged[path] = hashlib.sha256(data).digest()
        return path

    def disk(self, name: str = "disk") -> Path:
        """A 22 MB tmpfs at `name`, unmounted on every way out of the case."""
        if os.geteuid() != 0:
            raise NotRunnable("mounting a tmpfs needs root")
        path = self.folder / name
        path.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(path)],
                                 capture_output=True, text=True, check=False)
        if mounted.returncode:
            raise NotRunnable(f"mount -t tmpfs failed: {mounted.stderr.strip()[:100]}")
        self.stack.callback(unmount, path)
        return path

    def image_folder(self, root: Path, train: int, test: int) -> None:
        """CIFAR-10 as an image folder of 32x32 JPEGs (train/<class>/*.jpg, test/<class>/*.jpg), `train` and `test`
        images per class."""
        draw = np.random.default_rng(0)
        for split, count in (("train", train), ("test", test)):
            for label, name in enumerate(CLASSES):
                (root / split / name).mkdir(parents=True)
                for index in range(count):
                    pixels = np.clip(draw.normal(25 * label, 40, (32, 32, 3)), 0, 255).astype(np.uint8)
                    Image.fromarray(pixels).save(root / split / name / f"{index:04d}.jpg", quality=90)


def unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)  # busy: detached now, freed later


def fill(disk: Path, leave: int) -> None:
    """Take all of `disk`'s free space but `leave` bytes."""
    status = os.statvfs(disk)
    with open(disk / "filler", "wb") as handle:
        handle.write(bytes(max(0, status.f_bavail * status.f_frsize - leave)))


@dataclass(frozen=True)
class Case:
    """One fault a user can cause: how it is set up, the commands that meet it, and what they must say."""

    name: str
    prepare: Callable[[Workspace], list[list[str]]]  # sets the fault up; the commands to run, in order
    causes: tuple[str, ...]  # patterns the output must match, each
    warning: bool = False  # the job must go on (exit 0) and say so
    timeout_s: float = 90.0  # of each command
    check: Callable[[Workspace, list[Run]], list[str]] | None = None  # the case's own rules
