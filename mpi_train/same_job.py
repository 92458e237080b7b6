"""Every rank must run the same job: the same release of torch, the same code of this package, the same settings.

Each host runs its own installation and reads its own files, and a host left at another version (a copy of the code
not pulled there, a torch upgraded on one node) or given other settings (an MPMD launch with other flags, or a
variable set otherwise on one host) fails far from its cause: ranks whose code or settings differ take other numbers of
steps, or call other collectives, and wait for each other until --timeout; torch versions may disagree about what a
message or a checkpoint holds. So the ranks compare what they run as they join the job, and their settings before
any work, and a job whose ranks differ is refused, naming who runs what.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch

from .cluster import Cluster, disagreement
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


# settings a host's environment may give (MLFLOW_TRACKING_URI, MASTER_ADDR) that rank 0's alone decide: rank 0 tracks,
# and sends the others its rendezvous
HOSTS_OWN = ("tracking_uri", "master_addr")


def check_same_settings(settings: dict, cluster: Cluster) -> None:
    """Refuse, on every rank alike, a job whose ranks were given other settings (`settings`: this rank's config, as
    TrainConfig.as_dict holds it). Collective (one allgather)."""
    if cluster.info.world_size == 1:
        return
    as_flags = {f"--{key.replace('_', '-')}": value for key, value in settings.items() if key not in HOSTS_OWN}
    differences = disagreement(cluster.allgather(as_flags), cluster.hosts)
    if differences:
        raise UserError(f"the ranks were given different settings ({differences}). Every rank must train the same "
                        f"job: with other settings the ranks take other steps and wait for each other until --timeout. "
                        f"Give every rank the same flags (an MPMD launch, mpirun ... : ..., gives each its own) and "
                        f"environment, then run again.")
