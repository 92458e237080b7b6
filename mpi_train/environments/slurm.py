"""Slurm without MPI (`srun python -m mpi_train`): each task's place from SLURM_PROCID and friends.

The ranks meet at a store on the step's first node (MASTER_ADDR/MASTER_PORT if set,
else the first host of the node list and a port derived from the job id), and the
job's object collectives go through it, so MPI is never initialised.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Mapping
from typing import Any

from ..errors import UserError
from .base import ClusterEnvironment, ObjectChannel, check_meeting_point, check_place, meeting_failed, whole_number
from .store import StoreChannel

PORT_BASE, PORT_SPAN = 15000, 20000  # derived ports fall in 15000-34999
# what says where the ranks meet, named when they do not
MEETING_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_STEP_NODELIST",
                     "SLURM_JOB_NODELIST", "SLURM_NODELIST", "MASTER_ADDR", "MASTER_PORT")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: `node[03-05,9],gpu1` -> `node03`."""
    first = re.match(r"[^,\[]*(\[[^\]]*\])?[^,\[]*", nodelist.strip()).group(0)
    bracket = re.search(r"\[([^\]]*)\]", first)
    if not bracket:
        return first
    start = bracket.group(1).split(",")[0].split("-")[0]  # zero padding is kept: 03 stays 03
    return first[:bracket.start()] + start + first[bracket.end():]


class SlurmEnvironment(ClusterEnvironment):
    name = "slurm"

    def __init__(self, env: Mapping[str, str] = os.environ, timeout_s: float = 300.0):
        self.env = dict(env)
        if not self.detect(self.env):
            raise UserError("--launcher slurm needs the variables srun gives each task (SLURM_PROCID, SLURM_STEP_ID, "
                            "SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_STEP_NODELIST "
                            "or SLURM_JOB_NODELIST), and some are not set. Start every task with srun "
                            "(see slurm/train.sbatch), or use --launcher auto.")
        self._store = None
        self._timeout = datetime.timedelta(seconds=timeout_s)

    @staticmethod
    def detect(env: Mapping[str, str] = os.environ) -> bool:
        """A task of a job step (srun); a batch script or an salloc shell is not one, though it has SLURM_* too."""
        return (all(name in env for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"))
                and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env)
                and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env)
                and ("SLURM_STEP_NODELIST" in env or "SLURM_JOB_NODELIST" in env or "SLURM_NODELIST" in env))

    def connect(self) -> None:
        from torch.distributed import TCPStore

        check_place(self)
        rank, world = self.global_rank(), self.world_size()
        variables = " ".join(f"{name}={self.env[name]}" for name in MEETING_VARIABLES if self.env.get(name))
        check_meeting_point(self, variables)
        try:
            self._store = TCPStore(self.main_address, self.main_port, world, is_master=rank == 0,
                                   timeout=self._timeout)
        except Exception as error:  # noqa: BLE001 - a store that cannot be served or reached, said in one paragraph
            raise UserError(meeting_failed(self, variables, error, self._timeout.total_seconds())) from None
        self._channel = StoreChannel(self._store, rank, world)

    def world_size(self) -> int:
        name = "SLURM_STEP_NUM_TASKS" if self.env.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
        return whole_number(self.env, name, self.name)

    def global_rank(self) -> int:
        return whole_number(self.env, "SLURM_PROCID", self.name)

    def local_rank(self) -> int:
        return whole_number(self.env, "SLURM_LOCALID", self.name)

    def node_key(self) -> Any:
        return ("node", self.env["SLURM_NODEID"])

    @property
    def main_address(self) -> str | None:
        if self.env.get("MASTER_ADDR"):
            return self.env["MASTER_ADDR"]
        nodes = self.env.get("SLURM_STEP_NODELIST") or self.env.get("SLURM_JOB_NODELIST") or self.env["SLURM_NODELIST"]
        return first_host(nodes)

    @property
    def main_port(self) -> int | None:
        if self.env.get("MASTER_PORT"):
            return whole_number(self.env, "MASTER_PORT", self.name)
        job, step = (next((whole_number(self.env, name, self.name) for name in names if self.env.get(name)), 0)
                     for names in (("SLURM_JOB_ID", "SLURM_JOBID"), ("SLURM_STEP_ID", "SLURM_STEPID")))
        return PORT_BASE + (job * 7 + step) % PORT_SPAN  # steps of one job in a row differ too

    @property
    def channel(self) -> ObjectChannel:
        return self._channel

    @property
    def store(self):
        return self._store
