"""torchrun (torch.distributed.run): the ranks are given in RANK, WORLD_SIZE, LOCAL_RANK, ...

The ranks meet through torch's env:// rendezvous at MASTER_ADDR:MASTER_PORT (under
torchrun that is the agent's own store), and the job's object collectives go through
that store, so MPI is never initialised. With --max-restarts, each attempt's keys live under
a prefix of their own, and --resume auto continues from the last checkpoint.

Elastic: torchrun's agent (every torchrun launch; it sets TORCHELASTIC_RUN_ID) restarts the
workers at a new WORLD_SIZE when a node joins a `--nnodes MIN:MAX` job or one is lost. It
tells the workers neither MIN nor MAX, so under it --resume auto continues a checkpoint of any
world size, as --reshard does under mpirun: the global batch and the data order stay the
checkpoint's. For the agents to meet again when a node joins, every node's torchrun needs
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (ELASTIC_LAUNCH_ENV).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from typing import Any

from ..errors import UserError
from .base import ClusterEnvironment, ObjectChannel, check_meeting_point, check_place, meeting_failed, whole_number
from .store import StoreChannel

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
ELASTIC_AGENT = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent, which may restart the workers at another world size
# What torchrun's agents need to meet again when a node joins (torch 2.14): with the store they share by default, the
# node that joins waits for the new rendezvous round's MASTER_ADDR key, which the node already serving the store never
# writes, and its agent fails after 60 s. Unshared, each round's rank 0 worker serves a store of its own.
ELASTIC_LAUNCH_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


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

        check_place(self)
        rank, world = self.global_rank(), self.world_size()
        variables = " ".join(f"{name}={self.env[name]}" for name in VARIABLES)
        check_meeting_point(self, variables)
        try:
            store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world, timeout=self._timeout))
        except Exception as error:  # noqa: BLE001 - a store that cannot be served or reached, said in one paragraph
            raise UserError(meeting_failed(self, variables, error, self._timeout.total_seconds())) from None
        store = dist.PrefixStore(self.attempt_prefix(), store)
        self._store = store
        self._channel = StoreChannel(store, self.global_rank(), self.world_size())

    def attempt_prefix(self) -> str:
        """Where this attempt's keys live in the store. The agent's own store outlives an attempt, and the agent
        restarts the workers on it after a failure (the restart count grows) or a node's joining (the world grows):
        an earlier attempt's keys (its ranks' addresses, a failure report) must not be read by the next one. A store
        of the attempt's own (rank 0's, under ELASTIC_LAUNCH_ENV) starts empty, and there the restart count, which a
        node that joined later counts apart, must not split the ranks."""
        if self.env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            return "mpi_train/"
        return f"mpi_train/attempt{self.env.get('TORCHELASTIC_RESTART_COUNT', '0')}/world{self.world_size()}/"

    @staticmethod
    def detect(env: Mapping[str, str] = os.environ) -> bool:
        return all(name in env for name in VARIABLES)

    def world_size(self) -> int:
        return whole_number(self.env, "WORLD_SIZE", self.name)

    def global_rank(self) -> int:
        return whole_number(self.env, "RANK", self.name)

    def local_rank(self) -> int:
        return whole_number(self.env, "LOCAL_RANK", self.name)

    def node_key(self) -> Any:
        return ("node", self.env["GROUP_RANK"]) if "GROUP_RANK" in self.env else None  # None: grouped by host name

    @property
    def resizes_on_restart(self) -> bool:
        return ELASTIC_AGENT in self.env

    def resized_split_error(self, batch_size: int, accumulate: int) -> str | None:
        if not batch_size % (self.world_size() * accumulate):
            return None
        return elastic_split_error(batch_size, accumulate, nodes=int(self.env.get("GROUP_WORLD_SIZE", "1")),
                                   per_node=whole_number(self.env, "LOCAL_WORLD_SIZE", self.name))

    @property
    def main_address(self) -> str | None:
        return self.env["MASTER_ADDR"]

    @property
    def main_port(self) -> int | None:
        return whole_number(self.env, "MASTER_PORT", self.name)

    @property
    def channel(self) -> ObjectChannel:
        return self._channel

    @property
    def store(self):
        return self._store


def elastic_split_error(batch_size: int, accumulate: int, nodes: int, per_node: int) -> str:
    """Why a job that torchrun's agent started on `nodes` x `per_node` ranks cannot keep its global batch there, and
    the node counts near `nodes` across which it splits (an --nnodes range must hold only such counts)."""
    world = nodes * per_node
    share = per_node * accumulate
    fits = [count for count in range(1, batch_size // share + 1) if not batch_size % (count * share)]
    near = [count for count in fits if count < nodes][-1:] + [count for count in fits if count > nodes][:1]
    into = f" in {accumulate} micro-batches each (--accumulate)" if accumulate > 1 else ""
    counts = (f"the node counts nearest {nodes} that split it are {' and '.join(map(str, near))}"
              if near else f"no node count splits it with {per_node} process(es) a node")
    return (f"torchrun's agent started this attempt on {nodes} node(s) x {per_node} process(es) (WORLD_SIZE={world}), "
            f"and --batch-size {batch_size}, the global batch every attempt of the job keeps (--resume auto continues "
            f"its checkpoints on any number of ranks, as --reshard does), does not split evenly across {world} "
            f"ranks{into}. Relaunch torchrun with an --nnodes MIN:MAX range whose every node count splits it "
            f"({counts}), or with another --nproc-per-node; or start afresh in another --checkpoint-dir with a "
            f"--batch-size that every world size of the range splits.")
