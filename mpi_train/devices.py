"""Which process-group backend the job uses and which device each rank computes on.

`decide` is the one place this is decided, for training, the bench and the collectives
check alike; it is a pure function of what each rank sees, so it is tested without GPUs.
NCCL needs one CUDA device per rank, and never two ranks of one host on the same device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .config import BACKENDS
from .errors import UserError


@dataclass(frozen=True)
class RankGpus:
    """What one rank sees: its host, its index on that host, and the identities (UUIDs) of its visible GPUs."""

    host: str
    local_rank: int
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class Decision:
    backend: str  # "nccl" or "gloo", the same on every rank
    devices: tuple[str, ...]  # each rank's device: "cuda:<index>" or "cpu"


def gpu_index(rank: RankGpus) -> Optional[int]:
    """The visible GPU this rank takes: the one at its local rank; or the only one it sees, when the
    launcher gave each rank its own (CUDA_VISIBLE_DEVICES per task, srun --gpus-per-task=1)."""
    if rank.local_rank < len(rank.gpus):
        return rank.local_rank
    if len(rank.gpus) == 1:
        return 0
    return None


def decide(requested: str, ranks: Sequence[RankGpus]) -> Decision:
    """The backend and every rank's device: NCCL when each rank has a GPU of its own, else Gloo on CPUs."""
    if requested not in BACKENDS:
        raise UserError(f"--backend {requested!r} is unknown; choose one of {', '.join(BACKENDS)}.")
    indices = [gpu_index(rank) for rank in ranks]
    taken: dict[tuple[str, str], int] = {}
    shared = []  # (rank, rank it shares a GPU with)
    for number, (rank, index) in enumerate(zip(ranks, indices)):
        if index is None:
            continue
        owner = taken.setdefault((rank.host, rank.gpus[index]), number)
        if owner != number:
            shared.append((number, owner))
    missing = [number for number, index in enumerate(indices) if index is None]
    usable = not missing and not shared
    if requested == "nccl" and not usable:
        if missing:
            first = ranks[missing[0]]
            raise UserError(
                f"--backend nccl needs a CUDA device for every rank, but rank(s) {missing} (host {first.host}, "
                f"local rank {first.local_rank}, {len(first.gpus)} GPU(s) visible) have none. Start at most one "
                f"rank per GPU on each host, or use --backend gloo (or auto) to train on CPUs.")
        number, owner = shared[0]
        raise UserError(
            f"--backend nccl needs a GPU of its own for every rank, but ranks {owner} and {number} on host "
            f"{ranks[number].host} would share GPU {ranks[number].gpus[indices[number]]} (NCCL refuses that). "
            f"Start at most one rank per GPU on each host, or use --backend gloo (or auto).")
    if requested == "gloo" or not usable:
        return Decision("gloo", tuple("cpu" for _ in ranks))
    return Decision("nccl", tuple(f"cuda:{index}" for index in indices))


def visible_gpus() -> tuple[str, ...]:
    """This process's visible CUDA devices, by UUID where torch tells it (by index otherwise)."""
    import torch

    if not torch.cuda.is_available():
        return ()
    names = []
    for index in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        names.append(str(uuid) if uuid is not None else str(index))
    return tuple(names)
