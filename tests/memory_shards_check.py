"""Two Gloo ranks in one process pair (torch.multiprocessing): memory per rank of torch's sharded optimizers, measured.

Run by tests/test_memory.py: `python tests/memory_shards_check.py OUT.json`. Rank 0 writes what each rank held after
one step of momentum SGD: a replicated model (the baseline), ZeroRedundancyOptimizer (ZeRO-1: its optimizer state is
this rank's shard) and FSDP2's fully_shard (ZeRO-3: parameters, gradients and state are DTensors, each rank's share).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def one_step(net: nn.Module, optimizer) -> None:
    torch.manual_seed(1)
    net(torch.randn(8, 64)).sum().backward()
    optimizer.step()


def rank_main(rank: int, world: int, port: int, out: str) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from mpi_train.memory import held_bytes

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    figures = {}
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    one_step(net, optimizer)
    figures["replicated"] = held_bytes(net, optimizer)
    net = model()
    optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.SGD, lr=0.1, momentum=0.9)
    one_step(net, optimizer)
    figures["zero_redundancy"] = held_bytes(net, optimizer)
    net = model()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    one_step(net, optimizer)
    figures["fully_shard"] = held_bytes(net, optimizer)
    every = [None] * world
    dist.all_gather_object(every, figures)
    if rank == 0:
        with open(out, "w") as file:
            json.dump(every, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    mp.spawn(rank_main, args=(2, free, sys.argv[1]), nprocs=2, join=True)
