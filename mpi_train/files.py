"""Files written whole or not at all: a reader never sees half a file, a crash leaves the previous version."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(target: Path, write: Callable[[BinaryIO], None]) -> None:
    """`write` into a temporary file beside `target`, fsync, rename over it, fsync the folder: a reader never
    sees half a file, and a crash mid-write leaves the previous version intact (and no temporary file)."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, target)
    except BaseException:
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
