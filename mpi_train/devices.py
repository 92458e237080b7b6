"""Where a rank computes: its CPU threads, the process-group backend and its device.

`decide` is the one place the backend is decided, for training, the bench and the collectives
check alike; it is a pure function of what each rank sees, so it is tested without GPUs.
NCCL needs one CUDA device per rank, and never two ranks of one host on the same device.
`place` applies it all on a rank, the same way for training and for the bench.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING

from .config import BACKENDS
from .errors import UserError

if TYPE_CHECKING:
    import torch


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


def gpu_index(rank: RankGpus) -> int | None:
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


@dataclass(frozen=True)
class Placement:
    """This rank's process-group backend, device and CPU threads."""

    backend: str
    device: torch.device
    threads: int


def configure_threads(info, threads: int | None) -> int:
    """Give each rank its share of the host's cores (`info`: cluster.RankInfo): oversubscribed ranks fighting over
    threads crawl."""
    import torch

    usable = len(os.sched_getaffinity(0))
    shared = usable >= (os.cpu_count() or usable)  # not bound by the launcher: the host's ranks share its cores
    share = max(1, usable // info.local_world_size if shared else usable)
    if threads is None:
        threads = share
    elif threads > share and info.local_rank == 0:  # said once a host: each host may have its own core count
        ranks = info.local_world_size if shared else 1
        print(f"mpi_train: warning: --threads {threads} for each of {ranks} rank(s) on {info.host} asks for "
              f"{threads * ranks} threads of {usable} core(s): the threads take turns on the cores, and every step "
              f"waits for the slowest. Leave --threads out to share the cores ({share} a rank here).", flush=True)
    torch.set_num_threads(threads)
    return threads


def resolve_backend(cluster, requested: str) -> tuple[str, str]:
    """Collective: the backend and this rank's device (see decide), made current under NCCL."""
    import torch

    mine = RankGpus(cluster.info.host, cluster.info.local_rank, visible_gpus())
    seen = [RankGpus(host, local_rank, tuple(gpus)) for host, local_rank, gpus in cluster.allgather(astuple(mine))]
    decision = decide(requested, seen)
    device = decision.devices[cluster.info.rank]
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))  # else every rank's NCCL communicator lands on cuda:0
    return decision.backend, device


def place(cluster, backend: str, threads: int | None, deterministic: bool = False) -> Placement:
    """Threads first (cores shared by the host's ranks), then backend and device; collective (ranks agree on NCCL).
    On CUDA, cuDNN autotunes its convolutions (cudnn.benchmark, as PyTorch's tuning guide asks for convnets) unless
    `deterministic` asks for its deterministic algorithms: the only way a rerun equals the first bit for bit there."""
    import torch

    threads = configure_threads(cluster.info, threads)
    backend, device_name = resolve_backend(cluster, backend)
    if device_name.startswith("cuda"):
        torch.backends.cudnn.benchmark = not deterministic
        torch.backends.cudnn.deterministic = deterministic
        if deterministic:  # cuBLAS too: read when its first handle is made (the GPU check sets it at its start)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # and torch's deterministic kernels where it has them (the rest warn): set back for a job that does not ask
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
    return Placement(backend, torch.device(device_name), threads)  # under NCCL, resolve_backend made the device current


def run_shapes(trained, scored, input_shape: tuple[int, ...], train_batches, test_batches, device, dtype=None,
               scoring=None, computing=None, make_input=None) -> None:
    """Forward and backward of `trained` on zeros of every batch size training will take, then a forward of `scored`
    in eval mode (inside `scoring`, a context, if given) on every size scoring will take. `dtype`: the inputs' (int64
    for tokens); `computing`: what makes the context each forward runs in, as the job's do (its autocast);
    `make_input`: a batch of a size, in place of plain zeros."""
    import contextlib

    import torch

    computing = computing or contextlib.nullcontext
    make_input = make_input or (lambda batch: torch.zeros(batch, *input_shape, device=device, dtype=dtype))
    for batch in sorted({size for size in train_batches if size > 1}):  # BatchNorm trains on 2 samples or more
        with computing():
            output = trained(make_input(batch))
        output.float().sum().backward()
    scored.eval()
    try:
        with torch.no_grad(), scoring or contextlib.nullcontext():
            for batch in sorted({size for size in test_batches if size > 0}):
                with computing():
                    scored(make_input(batch))
    finally:
        scored.train()


def meet_shapes(model, input_shape: tuple[int, ...], train_batches, test_batches, device, dtype=None,
                computing=None) -> None:
    """Run a copy of `model` once on every batch size training (forward and backward) and scoring (forward) will
    take, leaving the model and the random streams as they were. `dtype`: the inputs' (int64 for tokens);
    `computing`: what makes the context the job's forwards run in (its autocast), whose kernels are the ones to meet."""
    import copy

    import torch

    replica = copy.deepcopy(model).train()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        run_shapes(replica, replica, input_shape, train_batches, test_batches, device, dtype, computing=computing)


def warm_autotuner(model, input_shape: tuple[int, ...], train_batches, test_batches, device, dtype=None,
                   computing=None) -> None:
    """cuDNN autotunes each input shape the first time it meets it: an epoch's smaller last batch cost 2.9 s of
    training time on an H200. Meet them all at setup, before anything is timed (CUDA with cudnn.benchmark only)."""
    import torch

    if device.type == "cuda" and torch.backends.cudnn.benchmark:
        meet_shapes(model, input_shape, train_batches, test_batches, device, dtype, computing)
        torch.cuda.synchronize(device)
