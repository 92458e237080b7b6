"""torchrun (torch.distributed.run): the ranks are given in RANK, WORLD_SIZE, LOCAL_RANK, ...

The ranks meet through torch's env:// rendezvous at MASTER_ADDR:MASTER_PORT (under
torchrun that is the agent's own store), and the job's object collectives go through
that store, so MPI is never initialised. With --max-restarts, each attempt's keys live under
a prefix of their own, and --resume auto continues from the last checkpoint.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from typing import Any

from ..errors import UserError
from .base import ClusterEnvironment, ObjectChannel
from .store import StoreChannel

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TorchrunEnvironment(ClusterEnvironment):
    name = "torchrun"

    def __init__(self, env: Mapping[str, str] = os.environ, timeout_s: float = 300.0):
        self.env = dict(env)
        missing = [name for name in VARIABLES if name not in self.env]
        if missing:
            raise UserError(f"--launcher torchrun needs the variables torchrun sets ({', '.join(VARIABLES)}), but "
                            f"{', '.join(missing)} are not set. Start the job with torchrun "
                            f"(torchrun --nproc-per-node N -m mpi_train ...), or use --launcher auto.")
        self._store = None
        self._timeout = datetime.timedelta(seconds=timeout_s)

    def connect(self) -> None:
        import torch.distributed as dist

        store, _, _ = next(dist.rendezvous("env://", rank=self.global_rank(), world_size=self.world_size(),
                                           timeout=self._timeout))
        # torchrun --max-restarts relaunches the workers on the same agent store: the keys of an earlier attempt
        # (its ranks' addresses, a failure report) must not be read by the next one
        attempt = self.env.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"mpi_train/attempt{attempt}/", store)
        self._store = store
        self._channel = StoreChannel(store, self.global_rank(), self.world_size())

    @staticmethod
    def detect(env: Mapping[str, str] = os.environ) -> bool:
        return all(name in env for name in VARIABLES)

    def world_size(self) -> int:
        return int(self.env["WORLD_SIZE"])

    def global_rank(self) -> int:
        return int(self.env["RANK"])

    def local_rank(self) -> int:
        return int(self.env["LOCAL_RANK"])

    def node_key(self) -> Any:
        return ("node", self.env["GROUP_RANK"]) if "GROUP_RANK" in self.env else None  # None: grouped by host name

    @property
    def main_address(self) -> str | None:
        return self.env["MASTER_ADDR"]

    @property
    def main_port(self) -> int | None:
        return int(self.env["MASTER_PORT"])

    @property
    def channel(self) -> ObjectChannel:
        return self._channel

    @property
    def store(self):
        return self._store
