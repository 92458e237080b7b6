"""ring: the ring allreduce written out with point-to-point send/recv, over the flat gradient buffer."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..timeline import now
from .flat import Flat


class Ring(Flat):
    """The bandwidth-optimal allreduce that library collectives use, spelled out step by step.

    The N ranks form a ring (rank r sends to r+1 and receives from r-1) and the
    buffer is cut into N chunks (sizes differ by at most one element when N does not
    divide it). Two phases of N-1 steps each:

    1. reduce-scatter: at step s, rank r sends its running sum of chunk (r-s) mod N
       and adds what it receives into chunk (r-s-1) mod N. After N-1 steps rank r
       holds the complete sum of chunk (r+1) mod N.
    2. all-gather: at step s, rank r sends the finished chunk (r+1-s) mod N and
       overwrites chunk (r-s) mod N with the one it receives.

    Each rank sends 2(N-1) chunks of S/N bytes, i.e. 2(N-1)/N·S, whatever N is;
    every step is one message each way, so latency grows as 2(N-1). Each chunk's sum
    is computed once, by one rank, and copied to the others, so all ranks end with
    bit-identical gradients (though summed in a different order than Gloo's allreduce).
    """

    message_name = "ring allreduce"

    def allreduce_sum(self, data: torch.Tensor) -> None:
        world, rank = dist.get_world_size(), dist.get_rank()
        if world == 1:
            return
        right, left = (rank + 1) % world, (rank - 1) % world
        chunks = torch.tensor_split(data, world)
        reduce_scatter_steps(chunks, rank, lambda step, send, receive: self.step(
            f"reduce-scatter {step + 1}", send, receive, right, left))
        for step in range(world - 1):  # all-gather
            send, receive = chunks[(rank + 1 - step) % world], chunks[(rank - step) % world]
            self.step(f"all-gather {step + 1}", send, receive, right, left)

    def step(self, name: str, send: torch.Tensor, receive: torch.Tensor, right: int, left: int) -> None:
        """One exchange, a message of its own in a timeline."""
        if not self._recorder.detailed:
            self.exchange(send, receive, right, left)
            return
        start = now()
        self.exchange(send, receive, right, left)
        self._recorder.message(f"ring {name}", start, now(), send.numel() * send.element_size())

    @staticmethod
    def exchange(send: torch.Tensor, receive: torch.Tensor, right: int, left: int, group=None) -> None:
        """Send to the right neighbour while receiving from the left one (posting both first cannot deadlock).

        The receive is posted first: on Gloo a blocking recv issued after an isend to the same peer
        waits for that send to finish, which halves a two-rank ring (18 MB each way over 1 Gbit/s:
        292 ms with isend then recv, 154 ms with irecv then isend, as fast as one way alone).
        """
        incoming = dist.irecv(receive, src=left, group=group)
        outgoing = dist.isend(send, dst=right, group=group)
        incoming.wait()
        outgoing.wait()


def ring_reduce_scatter(whole: torch.Tensor, shard: torch.Tensor, group=None) -> None:
    """`shard` = the sum across ranks of this rank's 1/N of `whole` (N equal chunks, rank r owning chunk r), by the
    ring's first phase: at step s rank r sends its running sum of chunk (r-s-1) to the right and adds what comes from
    the left into chunk (r-s-2), so after N-1 steps chunk r is complete. Each rank sends (N-1)/N·S, the bytes a
    bandwidth-optimal reduce-scatter moves, where Gloo's reduce_scatter_single allreduces the whole buffer
    (2(N-1)/N·S) and keeps a slice (docs/results.md, "What the sharded methods cost a step"). `whole` is summed
    into; ranks are the group's, which spans the world."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = whole.chunk(world)
    if world > 1:
        right, left = (rank + 1) % world, (rank - 1) % world
        reduce_scatter_steps(chunks, rank - 1, lambda _step, send, receive: Ring.exchange(
            send, receive, right, left, group))  # from one place back: chunk r ends here, not chunk r+1
    shard.copy_(chunks[rank])


def reduce_scatter_steps(chunks: tuple[torch.Tensor, ...], position: int, exchange) -> None:
    """The ring's first phase over `chunks` (chunk 0 the largest): at step s send the running sum of chunk
    (position-s) mod N to the right and add what comes from the left into chunk (position-s-1) mod N; after N-1 steps
    chunk (position+1) mod N holds the complete sum. `exchange(step, send, receive)` moves one step's messages."""
    world = len(chunks)
    incoming = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send, receive = chunks[(position - step) % world], chunks[(position - step - 1) % world]
        exchange(step, send, incoming[:receive.numel()])
        receive.add_(incoming[:receive.numel()])
