"""Run under mpirun: every registered sync method must leave each rank holding the mean gradient.

The expected mean is computed by hand in each process: it replays every rank's
backward pass locally (rank r feeds inputs filled with r + 1) and averages them.
Prints one line per method on rank 0; exits non-zero if any rank saw a wrong gradient.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from mpi_train.cluster import Cluster, init_process_group
from mpi_train.sync import SYNC_METHODS


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def local_gradients(model: nn.Module, rank: int) -> list[torch.Tensor]:
    model.zero_grad()
    inputs = torch.full((4, 6), float(rank + 1)) + torch.arange(6.0)
    model(inputs).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def main() -> int:
    cluster = Cluster.from_mpi()
    rank, world = cluster.info.rank, cluster.info.world_size
    init_process_group(cluster, "gloo", None, 60)
    reference = make_model()
    per_rank = [local_gradients(reference, r) for r in range(world)]
    expected = [torch.stack(grads).mean(0) for grads in zip(*per_rank)]
    failures = []
    for name, method_class in SYNC_METHODS.items():
        model = make_model()
        method = method_class()
        net = method.wrap(model)
        model.zero_grad()
        inputs = torch.full((4, 6), float(rank + 1)) + torch.arange(6.0)
        net(inputs).pow(2).sum().backward()
        method.sync(model)
        ok = all(torch.allclose(p.grad, e, rtol=1e-6, atol=1e-7) for p, e in zip(model.parameters(), expected))
        differs_from_local = any(not torch.equal(p.grad, g) for p, g in zip(model.parameters(), per_rank[rank]))
        if not (ok and (differs_from_local or world == 1)):
            failures.append(name)
    everyone = cluster.gather(failures)
    if rank == 0:
        for name in SYNC_METHODS:
            bad = [r for r, names in enumerate(everyone) if name in names]
            print(f"{name}: {'mean gradient on every rank' if not bad else f'WRONG on ranks {bad}'}")
    return 1 if any(cluster.allgather(bool(failures))) else 0


if __name__ == "__main__":
    sys.exit(main())
