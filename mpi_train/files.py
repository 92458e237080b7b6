"""Files written whole or not at all: a reader never sees half a file, a crash leaves the previous version."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(target: Path, write: Callable[[BinaryIO], None]) -> None:
    """`write` into a temporary file beside `target`, fsync, rename over it, fsync the folder: a reader never
    sees half a file, and a crash mid-write leaves the previous version intact (and no temporary file).

    A failure up to the rename (a full disk, in `write` or in the fsync; a rename refused) removes the temporary
    file, leaves `target` as it was and raises the failure itself, even if removing the file fails as well. A
    failure of the folder's fsync is raised too: `target` is then whole, but may not survive a power cut."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):  # the write's own failure is the one to report
            partial.unlink(missing_ok=True)
        raise
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power cut
    finally:
        os.close(folder)


def write_json_atomically(path: str, payload: dict) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, lambda handle: handle.write((json.dumps(payload, indent=2) + "\n").encode()))


def append_private(path: Path):
    """`path` opened for appending, created readable and writable by its owner only (spools: they hold a job's
    figures and the server's address), its folder too."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a")


def write_private(path: Path, text: str) -> None:
    """`text` into a new file only its owner can read (a password): never readable by others, not even briefly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        handle.write(text)


def write_figure(fig, path: Path) -> Path:
    """Lay a matplotlib figure out, write it as a PNG (its folder made if missing) and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt  # loaded only by the commands that draw

    plt.close(fig)
    return path
