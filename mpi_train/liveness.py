"""Who is still reachable: every rank's heartbeat through the job's store, watched by rank 0.

A host whose link goes down stops beating long before a collective times out. So rank 0
can name the host that went silent (and, if it beats again, report the stall: which step,
how long, which host), and a rank cut off from the store knows that it is the one cut off,
and does not wait on the store while it stops. Only jobs that span hosts keep a heartbeat:
on one host there is no link to lose.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

HEARTBEAT_KEY = "mpi_train/heartbeat"
BEAT_S = 0.5  # between two beats of a rank
SILENT_S = 3.0  # a host none of whose ranks has beaten for this long is stalled (or gone)
LONG_WAIT_S = 24 * 3600.0  # a beat waits this long for its answer: a timeout would only add retries and log lines


@dataclass(frozen=True)
class Stall:
    """A host that went silent: from which step, for how long (so far, if it has not come back)."""

    host: str
    ranks: tuple[int, ...]
    step: int
    seconds: float

    def describe(self) -> str:
        return f"{host_with_ranks(self.host, self.ranks)} silent for {self.seconds:.1f} s from step {self.step}"


def host_with_ranks(host: str, ranks: tuple[int, ...]) -> str:
    """How messages name a host: `host node2 (ranks 2, 3)`."""
    return f"host {host} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"


def _client(address: str, timeout_s: float):
    """A store client of our own: the job's client belongs to the training loop's thread."""
    from torch.distributed import TCPStore

    host, port = address.rsplit(":", 1)
    return TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout_s),
                    wait_for_workers=False)


class Heartbeat:
    """A rank other than 0: counts up its key in the store twice a second from a thread.

    `add` waits for the store's answer, and while a link is down the answer does not come (TCP
    keeps the request until the link is back, so a blink costs nothing here); `cut_off_s` says
    how long this rank has been waiting."""

    def __init__(self, address: str, rank: int):
        self.address, self.key = address, f"{HEARTBEAT_KEY}/{rank}"
        self.last_answer = time.monotonic()
        self.stop = threading.Event()
        threading.Thread(target=self._beat, name="mpi_train-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        try:
            store = _client(self.address, LONG_WAIT_S)
            while not self.stop.is_set():
                store.add(self.key, 1)
                self.last_answer = time.monotonic()
                self.stop.wait(BEAT_S)
        except Exception:  # noqa: BLE001, S110 - rank 0's store is gone: the job is ending, and cut_off_s keeps growing
            pass

    def cut_off_s(self) -> float:
        """Seconds since the store last answered, if that is more than SILENT_S; else 0."""
        silent = time.monotonic() - self.last_answer
        return silent if silent >= SILENT_S else 0.0

    def close(self) -> None:
        self.stop.set()


class Watch:
    """Rank 0: reads every other host's beats and notices a host gone silent, and its return.

    `on_stall(stall)` is called (from the watch's thread) when a silent host beats again;
    `silent()` lists the hosts silent now, for a failure's message and the run's tags."""

    def __init__(self, address: str | None, hosts: tuple[str, ...], step: Callable[[], float],
                 on_stall: Callable[[Stall], None]):
        self.address, self.step, self.on_stall = address, step, on_stall
        here = hosts[0]
        self.ranks_of: dict[str, tuple[int, ...]] = {}
        for rank, host in enumerate(hosts):
            if host != here:
                self.ranks_of[host] = (*self.ranks_of.get(host, ()), rank)
        now = time.monotonic()
        self.counts = {rank: None for ranks in self.ranks_of.values() for rank in ranks}
        self.changed = dict.fromkeys(self.counts, now)  # when each rank's count last moved, on this clock
        self.silent_from: dict[str, tuple[float, int]] = {}  # host -> (time of its last beat, step then)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        if address is not None:  # None: readings come from update() alone, as in the unit tests
            threading.Thread(target=self._watch, name="mpi_train-heartbeat-watch", daemon=True).start()

    def _watch(self) -> None:
        store, keys = None, {rank: f"{HEARTBEAT_KEY}/{rank}" for rank in self.counts}
        while not self.stop.wait(BEAT_S):
            try:
                store = store or _client(self.address, SILENT_S)
                beaten = [rank for rank, key in keys.items() if store.check([key])]  # a get would wait for the others
                counts = dict(zip(beaten, store.multi_get([keys[rank] for rank in beaten]))) if beaten else {}
            except Exception:  # noqa: BLE001 - our own store going away: the job is ending
                store = None
                continue
            self.update(counts, time.monotonic())

    def update(self, counts: dict, now: float) -> None:
        """Take one reading of the counts; report the hosts that came back."""
        back = []
        with self.lock:
            for rank, count in counts.items():
                if count != self.counts[rank]:
                    self.counts[rank], self.changed[rank] = count, now
            for host, ranks in self.ranks_of.items():
                last = max(self.changed[rank] for rank in ranks)
                if now - last >= SILENT_S and host not in self.silent_from:
                    self.silent_from[host] = (last, int(self.step()))
                elif now - last < SILENT_S and host in self.silent_from:
                    began, step = self.silent_from.pop(host)
                    back.append(Stall(host, ranks, step, last - began))
        for stall in back:
            self.on_stall(stall)

    def silent(self, now: float | None = None) -> list[Stall]:
        """The hosts silent now, each with how long so far (from the last reading: the watch may lag a little)."""
        now = time.monotonic() if now is None else now
        with self.lock:
            stalls = []
            for host, ranks in self.ranks_of.items():
                last = max(self.changed[rank] for rank in ranks)
                if now - last >= SILENT_S:
                    stalls.append(Stall(host, ranks, self.silent_from.get(host, (last, int(self.step())))[1],
                                        now - last))
            return stalls

    def close(self) -> None:
        self.stop.set()


class Liveness:
    """This rank's part: the Watch on rank 0, a Heartbeat on the others; nothing when the job is on one host.

    Stalls (a host silent, then back) go to whoever subscribed with `on_stall` (rank 0's reporter); those seen
    before anyone subscribed are handed over at subscription."""

    def __init__(self, cluster):
        self.watch: Watch | None = None
        self.heartbeat: Heartbeat | None = None
        self.stalls: list[Stall] = []
        self.listeners: list[Callable[[Stall], None]] = []
        if not cluster.spans_hosts or cluster.store_address is None:
            return
        if cluster.info.is_main:
            self.watch = Watch(cluster.store_address, cluster.hosts, lambda: cluster.step_reached, self._stalled)
        else:
            self.heartbeat = Heartbeat(cluster.store_address, cluster.info.rank)

    def _stalled(self, stall: Stall) -> None:
        self.stalls.append(stall)
        for listener in list(self.listeners):
            listener(stall)

    def on_stall(self, listener: Callable[[Stall], None]) -> None:
        """Call `listener(stall)` for every stall, those already seen first."""
        self.listeners.append(listener)
        for stall in list(self.stalls):
            listener(stall)

    def silent(self) -> list[Stall]:
        """Rank 0: the hosts silent now (else empty)."""
        return self.watch.silent() if self.watch else []

    def cut_off_s(self) -> float:
        """Other ranks: how long rank 0's host has not answered, when that is past SILENT_S (else 0)."""
        return self.heartbeat.cut_off_s() if self.heartbeat else 0.0

    def alone(self) -> bool:
        """Rank 0: every other host is silent, so the link cut may as well be this host's own."""
        return bool(self.watch and self.watch.ranks_of) and len(self.watch.silent()) == len(self.watch.ranks_of)

    def close(self) -> None:
        """The job is over: stop watching, and let go of its listeners (a reporter holds the job's model and sync
        method, which a process that runs several jobs, the GPU check, would otherwise keep)."""
        for part in (self.watch, self.heartbeat):
            if part:
                part.close()
        self.listeners.clear()


class NoLiveness(Liveness):
    """Before the process group exists, and on one host."""

    def __init__(self):
        self.watch = self.heartbeat = None
        self.stalls, self.listeners = [], []
