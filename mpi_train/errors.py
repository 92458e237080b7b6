"""Errors a user can act on, kept apart from bugs so they print without a traceback (no torch needed to print one)."""

from __future__ import annotations

import argparse
import os
import tempfile
import textwrap
import traceback
from pathlib import Path


class UserError(Exception):
    """Bad input or environment: printed as one paragraph (what, where, how to fix), exit 2.

    `collective=True` means every rank raises the same error at the same point (config
    checks, outcomes already shared over MPI), so ranks may simply exit together. Any
    other error might be raised by some ranks only, and then the whole MPI job is aborted
    so that no rank waits forever for a peer that has gone.
    """

    exit_code = 2

    def __init__(self, message: str, *, collective: bool = True):
        super().__init__(message)
        self.collective = collective


def format_error(message: str, prog: str = "mpi_train") -> str:
    """`PROG: error: MESSAGE` as one paragraph wrapped at 100 columns, for stderr."""
    return textwrap.fill(f"{prog}: error: {message}", width=100, break_long_words=False, break_on_hyphens=False)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose refusal of a flag is one paragraph (what is wrong, and where every flag is listed)
    rather than the whole usage, dozens of lines, above argparse's one line."""

    def error(self, message: str):
        self.exit(2, format_error(f"{message}. `{self.prog} --help` lists every flag.", prog=self.prog) + "\n")


def raised_in_collective(error: BaseException) -> bool:
    """True if the error came out of torch.distributed (a collective or its store): most often the
    symptom of another rank having failed, so the rank that caught it is not the one to blame."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and f"torch{os.sep}distributed{os.sep}" in frames[-1].filename


def folder_write_error(folder: Path) -> str | None:
    """None if `folder` is a folder this process can write to (created if missing), else the system's reason."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return None


def system_error(error: BaseException) -> OSError | None:
    """The OSError behind `error`, however a library wrapped it, or None. torch.save on a full disk raises a
    RuntimeError (`[enforce fail at inline_container.cc]`) chained from the OSError `[Errno 28]`: a write that
    failed for the system's reason is told by that reason, not by the wrapper's type."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
