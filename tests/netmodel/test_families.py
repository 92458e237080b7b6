"""Collective families: bytes per rank, the floor a link allows and the alpha-beta time, against closed forms."""

import pytest

from mpi_train.netmodel import FAMILIES, Layout, Link, Network, bus_bandwidth, family_of
from mpi_train.netmodel.families import NOT_YET_PRICED
from mpi_train.sync import SYNC_METHODS, SyncMethod

MB = 1e6
NET = Network(intra=Link(alpha=10e-6, beta=1 / 1e9), inter=Link(alpha=100e-6, beta=1 / 125e6))  # 1 GB/s, 1 Gbit/s


def test_traffic_and_floors_follow_the_closed_forms():
    ring, root = FAMILIES["ring"], FAMILIES["root"]
    assert ring.traffic(8 * MB, 4, 2) == (12 * MB, 12 * MB)  # 2(N-1)/N·S
    assert root.traffic(8 * MB, 4, 0) == (24 * MB, 24 * MB)  # the root: (N-1)·S each way
    assert root.traffic(8 * MB, 4, 3) == (8 * MB, 8 * MB)
    assert ring.floor(8 * MB, 4, 1e9) == pytest.approx(0.012) and root.floor(8 * MB, 4, 1e9) == pytest.approx(0.048)
    hierarchical, two_hosts = FAMILIES["hierarchical"], ("a", "a", "b", "b")
    assert hierarchical.traffic(8 * MB, 4, 2, two_hosts) == (8 * MB, 8 * MB)  # a leader: 2(H-1)/H·S between hosts
    assert hierarchical.traffic(8 * MB, 4, 3, two_hosts) == (0.0, 0.0)  # the others stay within their host
    assert hierarchical.floor(8 * MB, 4, 1e9, two_hosts) == pytest.approx(0.008)
    assert hierarchical.traffic(8 * MB, 4, 1, ("a",) * 4) == ring.traffic(8 * MB, 4, 1)  # one host: plain allreduce
    assert bus_bandwidth(8 * MB, 4, 0.012) == pytest.approx(1e9)  # a ring at its floor runs at the link's speed


def test_ring_on_two_hosts_pays_the_inter_host_link():
    ring = FAMILIES["ring"].time
    # N=4, 2 per host, S=8 MB: 2(N-1) alpha + 2(N-1)/N S beta = 6*100us + 12 MB / 125 MB/s
    assert ring(8 * MB, Layout(4, 2), NET) == pytest.approx(600e-6 + 0.096)
    # one host: the intra link, 6*10us + 12 MB / 1 GB/s
    assert ring(8 * MB, Layout(4, 4), NET) == pytest.approx(60e-6 + 0.012)
    assert ring(8 * MB, Layout(1, 1), NET) == 0


def test_root_moves_everything_through_rank_0s_host_link():
    # N=8 on 4 hosts of 2: 14 alphas, 2*(6 S over the inter link + 1 S over the intra-host link)
    expected = 14 * 100e-6 + 2 * (6 * 8 * MB / 125e6 + 1 * 8 * MB / 1e9)
    assert FAMILIES["root"].time(8 * MB, Layout(8, 2), NET) == pytest.approx(expected)


def test_hierarchical_crosses_hosts_once_per_leader():
    # N=8 on 2 hosts of 4: 2 levels each way inside (log2 4), then a ring of 2 leaders
    inside = 2 * 2 * (10e-6 + 8 * MB / 1e9)
    expected = inside + 2 * 100e-6 + 8 * MB / 125e6
    assert FAMILIES["hierarchical"].time(8 * MB, Layout(8, 4), NET) == pytest.approx(expected)
    assert FAMILIES["hierarchical"].time(8 * MB, Layout(4, 1), NET) == FAMILIES["ring"].time(8 * MB, Layout(4, 1), NET)


def test_every_registered_method_names_a_known_family():
    for name, method_class in SYNC_METHODS.items():
        assert family_of(method_class) is not None or method_class.collective in NOT_YET_PRICED, name


def test_an_unknown_family_is_refused_with_where_to_look():
    class Misnamed(SyncMethod):
        collective = "tree"

    with pytest.raises(ValueError, match="Misnamed.collective = 'tree'.*families.py"):
        family_of(Misnamed)
    assert family_of(SyncMethod) is None
