"""Every rank must run the same software: the same release of torch and the same code of this package.

Each host runs its own installation, and a host left at another version (a copy of the code not pulled there, a
torch upgraded on one node) fails far from its cause: ranks whose code differs call other collectives, or the same
ones in another order, and wait for each other until --timeout; torch versions may disagree about what a message or
a checkpoint holds. So the ranks compare what they run as they join the job, and a job whose ranks differ is refused
before anything starts, naming who runs what.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch

from .cluster import disagreement
from .errors import UserError

PACKAGE = Path(__file__).resolve().parent


@functools.cache
def code_digest() -> str:
    """This package's Python files, by path and content, hashed: another version of any file changes it."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(f"{path.relative_to(PACKAGE)}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def software() -> dict[str, str]:
    """What this rank runs, as the others compare it: torch's release (a CUDA build and a CPU one of it, 2.14.1+cu130
    and 2.14.1+cpu, speak the same Gloo) and this code."""
    return {"torch": torch.__version__.split("+")[0], "mpi_train's code": code_digest()}


def check_same_software(everyone: list[dict[str, str]], hosts: tuple[str, ...]) -> None:
    """Refuse a job whose ranks (`everyone`: each rank's `software()`) run different software."""
    differences = disagreement(everyone, hosts)
    if differences:
        raise UserError(f"the ranks run different software ({differences}). Every host must run the same torch and "
                        f"mpi_train: ranks of other versions wait for each other in collectives they do not "
                        f"share. Install the same versions on every host (the same commit of this code, pip install "
                        f"-e . there, or one installation every host shares), then run again.")
