"""Heartbeats: rank 0 names a host that went silent, and reports its return as a stall; a rank that loses the
store knows it is cut off. (The real thing, a test host's link taken down, is in test_network_faults.py.)"""

import datetime
import time

import pytest
from torch.distributed import TCPStore

from mpi_train.liveness import SILENT_S, Heartbeat, NoLiveness, Stall, Watch

HOSTS = ("a", "a", "b", "b", "c")


def watch(stalls: list, step=lambda: 7) -> Watch:
    return Watch(None, HOSTS, step, stalls.append)


def test_a_host_whose_every_rank_stops_beating_is_silent_and_its_return_is_a_stall():
    stalls = []
    w = watch(stalls)
    t0 = time.monotonic()
    w.update({2: 1, 3: 1, 4: 1}, t0)
    w.update({2: 1, 3: 1, 4: 2}, t0 + SILENT_S + 1)  # b quiet for SILENT_S + 1 s; c beat
    assert ([(s.host, s.ranks, s.step, s.seconds) for s in w.silent(t0 + SILENT_S + 1)]
            == [("b", (2, 3), 7, pytest.approx(SILENT_S + 1))])  # t0 + x - t0 is x only to rounding
    assert stalls == []
    w.update({2: 2, 3: 1, 4: 3}, t0 + 10)  # one of b's ranks beats again: b is back
    assert w.silent(t0 + 10) == []
    assert stalls == [Stall("b", (2, 3), 7, pytest.approx(10.0))]


def test_one_quiet_rank_of_a_host_is_not_a_silent_host_nor_is_rank_0s_own_host():
    stalls = []
    w = watch(stalls)
    t0 = time.monotonic()
    w.update({2: 1, 3: 1, 4: 1}, t0)
    for k in range(1, 10):
        w.update({2: 1, 3: 1 + k, 4: 1 + k}, t0 + k)  # rank 2 stuck (SIGSTOP, say), rank 3 beats
    assert w.silent(t0 + 9) == [] and stalls == []
    assert set(w.ranks_of) == {"b", "c"}  # rank 0's host "a" is not watched: rank 1 shares rank 0's machine


def test_a_rank_knows_it_is_cut_off_once_the_store_stops_answering():
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    beat = Heartbeat(f"127.0.0.1:{server.port}", 3)
    try:
        deadline = time.monotonic() + 10
        while not server.check(["mpi_train/heartbeat/3"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert int(server.get("mpi_train/heartbeat/3")) >= 1
        assert beat.cut_off_s() == 0.0
        del server  # rank 0's store gone, as when its host's link goes down
        deadline = time.monotonic() + SILENT_S + 5
        while not beat.cut_off_s() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert beat.cut_off_s() >= SILENT_S
    finally:
        beat.close()


def test_rank_0_is_alone_only_when_every_other_host_is_silent():
    live = NoLiveness()
    assert not live.alone()  # one host, or no process group yet: nothing watched
    now = time.monotonic()
    live.watch = watch([])
    live.watch.update({2: 1, 3: 1, 4: 1}, now - 10 * SILENT_S)
    live.watch.update({2: 1, 3: 1, 4: 2}, now)  # c beats, b has been silent for long
    assert [s.host for s in live.watch.silent()] == ["b"] and not live.alone()
    live.watch = watch([])
    live.watch.update({2: 1, 3: 1, 4: 1}, now - 10 * SILENT_S)  # nobody since: this host's own link may be the cut one
    assert {s.host for s in live.watch.silent()} == {"b", "c"} and live.alone()


def test_a_closed_liveness_lets_go_of_its_listeners_and_hands_them_no_more_stalls():
    live, heard = NoLiveness(), []
    live.on_stall(heard.append)  # a job's reporter, which holds its model: a process running several jobs keeps it
    live._stalled(Stall("b", (2, 3), 3, 1.0))  # otherwise (the GPU check)
    live.close()
    live._stalled(Stall("b", (2, 3), 4, 2.0))
    assert len(heard) == 1 and live.listeners == []
