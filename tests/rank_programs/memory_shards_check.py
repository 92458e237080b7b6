"""Two Gloo ranks in one process pair (torch.multiprocessing): memory per rank of torch's sharded optimizers, measured.

Run by tests/test_memory.py: `python tests/rank_programs/memory_shards_check.py OUT.json`. Rank 0 writes what each
rank held after one step of momentum SGD: a replicated model (the baseline), ZeroRedundancyOptimizer (ZeRO-1: its
optimizer state is this rank's shard) and FSDP2's fully_shard (ZeRO-3: parameters, gradients and state are DTensors,
each rank's share; each module with parameters of its own is a unit). With a model name (`... OUT.json vgg11`) it
runs that model of mpi_train's registry instead of the small test network, for docs/results.md.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def model(name: str | None) -> nn.Module:
    torch.manual_seed(0)
    if name:
        from mpi_train.models import build_model

        return build_model(name)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def one_step(net: nn.Module, optimizer, name: str | None) -> None:
    from mpi_train.models import INPUT_SHAPES

    torch.manual_seed(1)
    net(torch.randn(2, *INPUT_SHAPES[name]) if name else torch.randn(8, 64)).sum().backward()
    optimizer.step()


def rank_main(rank: int, world: int, rendezvous: str, out: str, name: str | None) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from mpi_train.memory import held_bytes

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    figures = {}
    net = model(name)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    one_step(net, optimizer, name)
    figures["replicated"] = held_bytes(net, optimizer)
    net = model(name)
    optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.SGD, lr=0.1, momentum=0.9)
    one_step(net, optimizer, name)
    figures["zero_redundancy"] = held_bytes(net, optimizer)
    net = model(name)
    for unit in [m for m in net.modules() if m is not net and any(True for _ in m.parameters(recurse=False))]:
        fully_shard(unit)
    fully_shard(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    one_step(net, optimizer, name)
    figures["fully_shard"] = held_bytes(net, optimizer)
    every = [None] * world
    dist.all_gather_object(every, figures)
    if rank == 0:
        with open(out, "w") as file:
            json.dump(every, file)
    dist.barrier()  # neither rank tears its group down while the other still uses it
    dist.destroy_process_group()
    # and leaves without the interpreter's teardown, where torch's threads aborted one run in six to twelve
    # ("terminate called without an active exception") after all of the above had been done
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:  # a file rendezvous: no port to race other jobs for
        mp.spawn(rank_main, args=(2, os.path.join(folder, "rendezvous"), sys.argv[1],
                                  sys.argv[2] if len(sys.argv) > 2 else None), nprocs=2, join=True)
