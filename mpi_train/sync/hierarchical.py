"""hierarchical: reduce inside each host, allreduce among the hosts' leaders, broadcast inside each host."""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..cluster import GroupChannel
from ..timeline import NO_RECORDER, timed
from .flat import Flat
from .traits import TWO_LEVEL


def host_of_each_rank() -> list[int]:
    """For each rank, the lowest rank on its host: MPI's shared-memory split (as in cluster.py) when MPI launched
    the job, else the host names. Collective."""
    world = dist.get_world_size()
    # only if the job's launcher already initialised MPI: torchrun and srun jobs never do
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        comm = MPI.COMM_WORLD
        if comm.Get_size() == world:  # ranks numbered as the process group's (Cluster.open_process_group)
            local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
            leader = np.array([comm.Get_rank()], dtype=np.int64)
            local.Bcast(leader, root=0)  # buffer collectives: mpi4py's object ones would unpickle what arrives
            local.Free()
            leaders = np.zeros(world, dtype=np.int64)
            comm.Allgather(leader, leaders)
            return leaders.tolist()
    names = GroupChannel().allgather(socket.gethostname())
    return [names.index(name) for name in names]


def host_groups(hosts: Sequence[int] | None = None,
                timeout: timedelta | None = None) -> tuple[bool, int, object, object]:
    """Whether the job has two levels (several hosts, one holding several ranks), this rank's host leader, its host's
    process group and the leaders' group; `hosts` is each rank's leader (default: found by host_of_each_rank);
    `timeout`: the groups' (default: torch's for new groups).
    Collective: every rank creates every group, in the same order."""
    hosts = list(hosts) if hosts is not None else host_of_each_rank()
    if len(hosts) != dist.get_world_size():
        raise ValueError(f"hierarchical: {len(hosts)} host entries for {dist.get_world_size()} ranks")
    leaders = sorted(set(hosts))
    if not 1 < len(leaders) < len(hosts):
        return False, 0, None, None
    leader, host_group = hosts[dist.get_rank()], None
    for one in leaders:
        group = dist.new_group([r for r, host in enumerate(hosts) if host == one], timeout=timeout)
        if one == leader:
            host_group = group
    return True, leader, host_group, dist.new_group(leaders, timeout=timeout)


class Hierarchical(Flat):
    """Two-level allreduce for jobs that span hosts: only one rank per host uses the network.

    With H hosts of L ranks each, the flat gradient buffer is (1) summed onto each host's
    leader (its lowest rank) within the host (Gloo's TCP over loopback), (2) allreduced among the H leaders,
    whose links carry 2(H-1)/H·S instead of the L ring edges' 2(N-1)/N·S each that a flat
    ring of N = H·L ranks puts on every host's link, and (3) broadcast from the leader to
    its host's ranks. Everyone ends with the leader's copy, so ranks agree bit for bit.
    On one host, or with one rank per host, it is plain allreduce. The groups come from
    MPI's host split when the model is wrapped (collective); `hosts` (the leader rank of
    each rank) may be given to place the levels by hand, as the tests do on one machine.
    """

    traits = replace(Flat.traits, family=TWO_LEVEL)
    message_name = "hierarchical allreduce"

    def __init__(self, compressor=None, hosts: Sequence[int] | None = None):
        super().__init__(compressor)
        self.hosts = list(hosts) if hosts is not None else None
        self.leader: int = 0
        self.host_group = self.leader_group = None
        self.two_levels = False

    def wrap(self, model: nn.Module) -> nn.Module:
        self.two_levels, self.leader, self.host_group, self.leader_group = host_groups(self.hosts)
        return model

    def allreduce_sum(self, data: torch.Tensor) -> None:
        if not self.two_levels:
            dist.all_reduce(data, op=dist.ReduceOp.SUM)
            return
        nbytes = data.numel() * data.element_size()
        recorder = self._recorder if self._recorder.detailed else NO_RECORDER  # the levels: in a timeline only
        timed(recorder, "reduce in host", nbytes, dist.reduce, data, dst=self.leader, op=dist.ReduceOp.SUM,
              group=self.host_group)
        if dist.get_rank() == self.leader:
            timed(recorder, "allreduce among leaders", nbytes, dist.all_reduce, data, op=dist.ReduceOp.SUM,
                  group=self.leader_group)
        timed(recorder, "broadcast in host", nbytes, dist.broadcast, data, src=self.leader, group=self.host_group)
