"""Who we are in the job, and the torch.distributed process group built on top of it.

Which launcher started the job (mpirun, torchrun, srun) is the business of
mpi_train/environments; this module turns its answers into the job's view: ranks,
hosts, object collectives, the rendezvous and the process group.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import environments
from .environments import ClusterEnvironment, ObjectChannel
from .environments.base import DAEMON_END_DELAY_S
from .environments.mpi import stopped_together
from .environments.store import asked
from .errors import UserError
from .liveness import Liveness, NoLiveness

LOOPBACK_ADDRESS = "127.0.0.1"
PROGRESS_KEY = "mpi_train/progress"  # store key prefix: the step each rank has reached
ABORT_GRACE_S = 5.0  # an abort the launcher has not carried out by then: the process exits by itself
DISAGREEMENT_SHOWN = 4  # groups of ranks, and ranks of a group, that a disagreement names before it counts the rest
STOP_TOGETHER_S = 300.0  # a rank ending on an error waits this long for the others to end (the default --timeout)
# Before an abort: time for the launcher to forward what this rank just printed (why it fails). mpirun kills the
# ranks and may exit before it has read their last output, and a supervisor reads the reason from it.
ABORT_SAY_S = 0.5
# with the launcher gone, what the other ranks leave rank 0 to record the job's end before they stop
LAUNCHER_GONE_OTHERS_S = 3.0


@dataclass(frozen=True)
class SharedError:
    """An error every rank is said to raise together, which rank 0 alone prints (rankguard.guarded): what this rank
    would say of it, and how long it waits at its end for the others to stop too."""

    message: str | None = None  # None on rank 0, which has said it
    within_s: float = STOP_TOGETHER_S


_shared_error: SharedError | None = None


def note_shared_error(error: SharedError) -> None:
    global _shared_error  # read by exit_process, which the command line calls with a code only
    _shared_error = error


def exit_process(code: int) -> None:
    """End this rank now, skipping interpreter teardown.

    Gloo's worker threads can drop the last reference to a Python-owned tensor (a bucket
    buffer, a pending Work) after the interpreter has begun finalizing, which aborts the
    process with "terminate called without an active exception". MPI is finalized first,
    so mpirun sees a clean exit. MPI_Finalize waits for every rank, so the ranks meet first:
    a rank ending on an error it took for everyone's, while the others wait in a collective
    (the error was its own), says it and aborts the job instead of waiting for ever.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            error = _shared_error if code else None
            if not stopped_together(error.within_s if error else None):
                if error and error.message:
                    print(error.message, file=sys.stderr, flush=True)
                MPI.COMM_WORLD.Abort(code)
            MPI.Finalize()
    os._exit(code)


def _exit_now(code: int) -> None:
    """Exit without MPI's say: what is left when MPI itself cannot end the process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _group_ready() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


class GroupChannel(ObjectChannel):
    """Bytes through the open process group as uint8 tensors (lengths first, then the bytes padded to the longest),
    on the device its backend needs: torch's own object collectives would unpickle what arrives."""

    def __init__(self, src: int = 0):
        import torch
        import torch.distributed as dist

        self.dist, self.torch, self.src = dist, torch, src  # bcast_bytes' source (the others are rooted at 0)
        cuda = dist.get_backend() == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    def _tensor(self, data: bytes, length: int):
        padded = self.torch.zeros(length, dtype=self.torch.uint8)
        padded[:len(data)] = self.torch.frombuffer(bytearray(data), dtype=self.torch.uint8) if data else 0
        return padded.to(self.device)

    def _lengths(self, data: bytes) -> list[int]:
        lengths = [self.torch.zeros(1, dtype=self.torch.int64, device=self.device)
                   for _ in range(self.dist.get_world_size())]
        self.dist.all_gather(lengths, self.torch.tensor([len(data)], dtype=self.torch.int64, device=self.device))
        return [int(length.item()) for length in lengths]

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        lengths = self._lengths(data)
        parts = [self.torch.zeros(max(lengths), dtype=self.torch.uint8, device=self.device) for _ in lengths]
        self.dist.all_gather(parts, self._tensor(data, max(lengths)))
        return [part[:n].cpu().numpy().tobytes() for part, n in zip(parts, lengths)]

    def bcast_bytes(self, data: bytes) -> bytes:
        length = self.torch.tensor([len(data)], dtype=self.torch.int64, device=self.device)
        self.dist.broadcast(length, src=self.src)
        buffer = self._tensor(data if self.dist.get_rank() == self.src else b"", int(length.item()))
        self.dist.broadcast(buffer, src=self.src)
        return buffer.cpu().numpy().tobytes()

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        lengths = self._lengths(data)
        root = self.dist.get_rank() == 0
        parts = [self.torch.zeros(max(lengths), dtype=self.torch.uint8, device=self.device)
                 for _ in lengths] if root else None
        self.dist.gather(self._tensor(data, max(lengths)), gather_list=parts, dst=0)
        return [part[:n].cpu().numpy().tobytes() for part, n in zip(parts, lengths)] if root else None

    def scatter_bytes(self, parts: list[bytes] | None) -> bytes:
        root = self.dist.get_rank() == 0
        lengths = self.torch.tensor([len(part) for part in parts] if root else [0] * self.dist.get_world_size(),
                                    dtype=self.torch.int64, device=self.device)
        self.dist.broadcast(lengths, src=0)
        longest = int(lengths.max().item())
        mine = self.torch.zeros(longest, dtype=self.torch.uint8, device=self.device)
        self.dist.scatter(mine, scatter_list=[self._tensor(part, longest) for part in parts] if root else None, src=0)
        return mine[:int(lengths[self.dist.get_rank()].item())].cpu().numpy().tobytes()

    def abort(self, code: int) -> None:
        """A process group cannot stop its peers: this rank ends itself, and the launcher, which watches its ranks,
        ends the others (Cluster.abort uses the launcher's own channel, which reaches them directly)."""
        _exit_now(code)


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job, built once at start-up."""

    rank: int
    local_rank: int  # index among the ranks on this host
    world_size: int
    local_world_size: int  # ranks on this host
    host: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class Cluster:
    """This rank's place in the job plus the few object collectives the job needs.

    Before the process group exists they go through the launcher's channel (MPI, or the
    env:// store under torchrun and srun); once it exists, through torch.
    """

    def __init__(self, environment: ClusterEnvironment, info: RankInfo, hosts: tuple[str, ...]):
        self.environment = environment
        self.channel = environment.channel
        self.info = info
        self.hosts = hosts  # host of each rank, indexed by rank
        self.store = None  # the TCPStore once open_process_group has run; its server lives in rank 0's process
        self.store_address: str | None = None  # its host:port, for the heartbeat's own connections
        self.step_reached = 0.0  # what note_progress last recorded
        self.liveness: Liveness = NoLiveness()  # heartbeats, once the process group is open (liveness.py)
        self.gone_launcher: str | None = None  # the launcher's process, should it end before this rank

    @classmethod
    def discover(cls, launcher: str = "auto", timeout_s: float = 300.0) -> Cluster:
        """Connect through the launcher's environment (auto: the one that started us) and learn every rank's host;
        `timeout_s` (--timeout) bounds the wait for the others to meet."""
        environment = environments.choose(launcher, timeout_s=timeout_s)
        environment.connect()
        rank, world = environment.global_rank(), environment.world_size()
        try:
            environments.check_world(world, environment.name)
        except UserError as error:  # every rank found the same: rank 0 says it (rankguard.join_job)
            error.rank = rank
            raise
        ranks = environment.channel.allgather((socket.gethostname(), environment.node_key()))
        keys = [key if key is not None else name for name, key in ranks]  # no node key: the host name tells
        leaders = [keys.index(key) for key in keys]  # the host's first rank identifies the host
        hosts = host_labels([(name, leader) for (name, _), leader in zip(ranks, leaders)])
        info = RankInfo(
            rank=rank, local_rank=environment.local_rank(), world_size=world,
            local_world_size=leaders.count(leaders[rank]), host=hosts[rank],
        )
        cluster = cls(environment, info, hosts)
        environment.watch_launcher(cluster.launcher_gone)
        return cluster

    def launcher_gone(self, what: str) -> None:
        """The launcher ended without ending this rank (SIGKILL gives it no say): no one is left to stop the job or
        read its output. So the rank stops as the launcher's SIGTERM would stop it, rank 0 recording its runs KILLED
        (tracking/runs.py), instead of training on unseen until a collective fails. The other ranks follow
        LAUNCHER_GONE_OTHERS_S later, if rank 0's abort has not ended them by then."""
        self.gone_launcher = what
        if not self.info.is_main:  # rank 0 first, or its collective with a rank gone ends the job FAILED
            time.sleep(LAUNCHER_GONE_OTHERS_S)
        os.kill(os.getpid(), signal.SIGTERM)

    def launcher_lost(self) -> str | None:
        """The launcher's process, named, if it has ended (before the watch has said so, too); else None."""
        return self.gone_launcher or self.environment.launcher_lost()

    @classmethod
    def from_mpi(cls) -> Cluster:
        return cls.discover("mpi")

    @property
    def spans_hosts(self) -> bool:
        return self.info.local_world_size != self.info.world_size

    # Once the process group exists, object collectives go through it: its --timeout ends a wait for a stuck
    # peer, and unlike MPI's blocking collectives it lets rank 0's tracking threads run.

    @property
    def objects(self) -> ObjectChannel:
        return GroupChannel() if _group_ready() else self.channel

    def allgather(self, value: Any) -> list:
        return self.objects.allgather(value)

    def bcast(self, value: Any) -> Any:
        """Rank 0's value on every rank."""
        return self.objects.bcast(value)

    def scatter(self, values: list | None) -> Any:
        """values[r] (given on rank 0) on rank r."""
        return self.objects.scatter(values)

    def gather(self, value: Any) -> list | None:
        """Every rank's value on rank 0; None elsewhere."""
        return self.objects.gather(value)

    def open_process_group(self, backend: str, master_addr: str | None, timeout_s: float, device=None) -> str:
        """Open the torch.distributed process group, its store and the heartbeats; returns the rendezvous address.

        Under torchrun and srun the ranks already share the env:// store and the group is
        built on it. Under MPI, rank 0 opens the store itself on a free port and sends
        address:port to the others over MPI: a port chosen by one process and bound later by
        another can be stolen. A job that spans hosts then keeps a heartbeat through the store
        (liveness.py) until `liveness.close()`. Under NCCL the group is bound to the rank's `device` (a
        torch.device), so its collectives and barriers need not guess it (torch warns when they do).
        """
        import torch.distributed as dist
        from torch.distributed import TCPStore

        info = self.info
        timeout = datetime.timedelta(seconds=timeout_s)
        store = self.environment.store
        if store is not None and master_addr:  # every rank was given the flag: every rank says it alike
            raise UserError(f"--master-addr {master_addr} sets where rank 0 listens under mpirun, and this job was "
                            f"started by {self.environment.name}, whose ranks meet where its variables say "
                            f"({self.environment.main_address}:{self.environment.main_port}): drop --master-addr, or "
                            f"set the address the launcher's way (torchrun's own --master-addr, MASTER_ADDR under "
                            f"srun).")
        if store is not None:
            store.set_timeout(timeout)
            address = f"{self.environment.main_address}:{self.environment.main_port}"
        else:
            address, refused = rendezvous_address(self, master_addr), None
            if info.rank == 0:
                try:
                    listener = listen_on(address)  # only where the other ranks reach rank 0: loopback on one host
                except UserError as error:  # every rank waits for the address: each is told instead, and all stop
                    refused = str(error)
                else:
                    store = TCPStore(address, listener.getsockname()[1], info.world_size, is_master=True,
                                     timeout=timeout, wait_for_workers=False, master_listen_fd=listener.detach())
                    address = f"{address}:{store.port}"
            address, refused = self.bcast((address, refused))
            if refused:
                raise UserError(refused)
        host, port = address.rsplit(":", 1)
        if store is None:
            store = TCPStore(host, int(port), info.world_size, is_master=False, timeout=timeout)
        self.store = store  # also the channel a failing rank uses to reach rank 0 (see tracking/)
        self.store_address = f"{host}:{port}"
        if self.spans_hosts and "GLOO_SOCKET_IFNAME" not in os.environ:
            interface = _interface_of(_route_address(socket.gethostbyname(host)))
            if interface:
                os.environ["GLOO_SOCKET_IFNAME"] = interface  # Gloo must listen where peers can reach
        if backend == "gloo" and (missing := missing_interfaces(os.environ.get("GLOO_SOCKET_IFNAME", ""))):
            raise UserError(f"GLOO_SOCKET_IFNAME names {', '.join(missing)}, which host {info.host} has no interface "
                            f"called (it has {', '.join(sorted(name for _, name in socket.if_nameindex()))}): Gloo "
                            f"would fail in its first collective as if another rank had. Name an interface every "
                            f"host has, or unset it and the job picks the one that reaches rank 0.",
                            collective=False)
        bound = {"device_id": device} if backend == "nccl" and device is not None else {}
        dist.init_process_group(backend, store=store, rank=info.rank, world_size=info.world_size, timeout=timeout,
                                **bound)
        self.note_progress(0)
        self.liveness = Liveness(self)
        return address

    def abort(self, code: int) -> None:
        """End every rank of the job now (a peer may be blocked in a collective).

        If the launcher cannot carry the abort out within ABORT_GRACE_S, this process exits on its own. A host
        that lost the job (a rank whose heartbeat rank 0 no longer answers; rank 0 when every other host is
        silent) may be the one cut off from mpirun by a link gone down, and its launch daemon would then wait
        for orders forever: if it cannot reach mpirun, it is ended once this rank has had its chance to report."""
        if self.liveness.cut_off_s() or self.liveness.alone():
            self.environment.end_daemon_if_cut_off(DAEMON_END_DELAY_S)
        deadline = threading.Timer(ABORT_GRACE_S, _exit_now, (code,))
        deadline.daemon = True
        deadline.start()
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(ABORT_SAY_S)
        self.channel.abort(code)

    def agree(self, outcome: str | None, what: str) -> None:
        """Share each rank's error message (None if fine); if any failed, all raise the same error."""
        failures = [(r, msg) for r, msg in enumerate(self.allgather(outcome)) if msg]
        if failures:
            rank, message = failures[0]
            where = f" (on rank {rank}, host {self.hosts[rank]})" if self.info.world_size > 1 else ""
            raise UserError(f"{what}{where}: {message}")

    def note_progress(self, step: float) -> None:
        """Record how far this rank has got (the step whose sync it is at; +0.5 in evaluation), so a failed
        collective can name who is behind."""
        self.step_reached = step
        if self.store is not None:
            self.store.set(f"{PROGRESS_KEY}/{self.info.rank}", str(step))

    def laggards(self) -> list[int]:
        """After a collective failed: the ranks that had not reached the step the others had.

        Empty when the store cannot tell (rank 0, which serves it, is gone) or nobody is behind.
        """
        if self.store is None or self.liveness.cut_off_s():  # cut off, the store would only make us wait
            return []
        self.store.set_timeout(datetime.timedelta(seconds=5))
        # the store's server lives in rank 0, which may be the one that died
        steps = asked(self.store, lambda: [float(v) for v in self.store.multi_get(
            [f"{PROGRESS_KEY}/{r}" for r in range(self.info.world_size)])])
        return [rank for rank, step in enumerate(steps) if step < max(steps)] if steps else []

    def run_per_host(self, action: Callable[[], None], what: str) -> None:
        """Run `action` on one rank per host while the host's other ranks wait; failures reach every rank.

        Used for downloads: two ranks writing the same files would corrupt them.
        """
        outcome = None
        if self.info.local_rank == 0:
            try:
                action()
            except UserError as error:
                outcome = str(error)
        self.agree(outcome, what)


def host_labels(ranks: list[tuple[str, int]]) -> tuple[str, ...]:
    """Each rank's host label from (host name, rank of the host's first rank) per rank.

    Which ranks share a host is MPI's answer (its shared-memory split); the name only
    labels it. Hosts that share a name (containers, namespaces, images all called
    `localhost`) are told apart by their first rank: `localhost-rank0`, `localhost-rank2`.
    """
    leaders_by_name: dict[str, set[int]] = {}
    for name, leader in ranks:
        leaders_by_name.setdefault(name, set()).add(leader)
    return tuple(name if len(leaders_by_name[name]) == 1 else f"{name}-rank{leader}" for name, leader in ranks)


def listen_on(address: str) -> socket.socket:
    """A listening socket on `address` (a free port): the rendezvous store listens there and nowhere else."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((socket.gethostbyname(address), 0))
    except (OSError, UnicodeError) as error:
        listener.close()
        why = ("it names a port too, and rank 0 picks a free port itself: give the address alone"
               if address.count(":") == 1 else
               "it is an IPv6 address, and the rendezvous listens on IPv4: give an IPv4 address or a host name"
               if ":" in address else
               "it is a name that does not resolve on rank 0's host" if isinstance(error, socket.gaierror) else
               "it is not an address of rank 0's host")
        raise UserError(f"rank 0 cannot listen for the rendezvous on {address!r} ({error.strerror or error}): {why}. "
                        f"Pass --master-addr (or set MASTER_ADDR) to an address of that host which the other hosts "
                        f"reach.") from None
    listener.listen(128)
    return listener


def missing_interfaces(names: str) -> list[str]:
    """The interfaces of a comma-separated list (GLOO_SOCKET_IFNAME's form) that this host lacks."""
    present = {name for _, name in socket.if_nameindex()}
    return [name for name in filter(None, (part.strip() for part in names.split(","))) if name not in present]


def _route_address(destination: str) -> str:
    """This host's address on the interface that routes to `destination` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((destination, 9))
        return probe.getsockname()[0]


def _interface_of(address: str) -> str | None:
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return None


def _external_addresses() -> list[str]:
    """This host's non-loopback IPv4 addresses, for rank 0 to find a route to."""
    import psutil

    return [
        a.address for addresses in psutil.net_if_addrs().values() for a in addresses
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]


def rendezvous_address(cluster: Cluster, master_addr: str | None) -> str | None:
    """The address rank 0 listens on: --master-addr, $MASTER_ADDR, loopback on one host,
    else rank 0's address on the interface that routes to the other hosts. Collective."""
    addresses = cluster.allgather(_external_addresses() if cluster.spans_hosts else [])
    if cluster.info.rank != 0:
        return None
    chosen = master_addr or os.environ.get("MASTER_ADDR")
    if chosen:
        return chosen
    if not cluster.spans_hosts:
        return LOOPBACK_ADDRESS
    return _route_address(address_on_other_host(cluster.hosts, addresses))


def address_on_other_host(hosts: tuple[str, ...], addresses: list[list[str]]) -> str:
    """An address of a host other than rank 0's, for rank 0 to find its route to the others.

    Addresses that rank 0's host holds too (a container bridge like 172.17.0.1 exists on
    every host) route to rank 0 itself, so they say nothing about the way out.
    """
    own = set(addresses[0])
    for rank, host in enumerate(hosts):
        if host != hosts[0]:
            for address in addresses[rank]:
                if address not in own:
                    return address
    raise UserError(
        f"cannot choose the rendezvous address: the ranks span the hosts {sorted(set(hosts))}, but no host "
        f"other than rank 0's ({hosts[0]}) has an IPv4 address of its own (addresses by rank: {addresses}). "
        f"Pass --master-addr (or set MASTER_ADDR) to an address of rank 0's host that the other hosts reach."
    )


def disagreement(everyone: list[dict], hosts: tuple[str, ...]) -> str | None:
    """How each rank's dict (`everyone`, by rank) differs from the others', in one clause: the ranks grouped by what
    they hold of the keys that differ (`rank 0 on a: torch 2.14.1; ranks 1, 2 on b: torch 2.11.0`); None when all
    are the same."""
    if all(each == everyone[0] for each in everyone):
        return None
    keys = list(dict.fromkeys(key for each in everyone for key in each))
    differing = [key for key in keys if len({repr(each.get(key)) for each in everyone}) > 1]
    groups: dict[str, list[int]] = {}
    for rank, each in enumerate(everyone):
        groups.setdefault(", ".join(f"{key} {_shown(each.get(key))}" for key in differing), []).append(rank)
    said = "; ".join(f"{_ranks(ranks, hosts)}: {held}" for held, ranks in list(groups.items())[:DISAGREEMENT_SHOWN])
    return said + (f"; and {len(groups) - DISAGREEMENT_SHOWN} more" if len(groups) > DISAGREEMENT_SHOWN else "")


def _shown(value: object) -> str:
    return "none" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _ranks(ranks: list[int], hosts: tuple[str, ...]) -> str:
    where = ", ".join(dict.fromkeys(hosts[rank] for rank in ranks))
    shown, more = ranks[:DISAGREEMENT_SHOWN], len(ranks) - DISAGREEMENT_SHOWN
    listed = ", ".join(map(str, shown)) + (f" and {more} more" if more > 0 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {listed} on {where}"
