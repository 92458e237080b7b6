"""Run under mpirun: training with a deliberately broken sync method, which the replica check must catch.

`skip_last_rank` averages gradients everywhere except on the last rank, which keeps its own:
the kind of bug a hand-written sync method can have. Arguments are passed to `python -m mpi_train`.
"""

from __future__ import annotations

import torch.distributed as dist

from mpi_train.sync import SYNC_METHODS
from mpi_train.sync.allreduce import AllReduce


class SkipLastRank(AllReduce):
    def sync(self, model) -> None:
        local = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        super().sync(model)
        if dist.get_rank() == dist.get_world_size() - 1:
            for param, grad in zip((p for p in model.parameters() if p.grad is not None), local):
                param.grad.copy_(grad)


SYNC_METHODS["skip_last_rank"] = SkipLastRank  # before the CLI reads the registry for its --sync choices

from mpi_train.cluster import exit_process
from mpi_train.commands.train import main

exit_process(main())  # as `python -m mpi_train` does: interpreter teardown can abort under Gloo's threads
