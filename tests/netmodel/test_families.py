"""Collective families: bytes per rank, the floor a link allows and the alpha-beta time, against closed forms."""

from dataclasses import replace

import pytest

from mpi_train.netmodel import (
    ALL_GATHER,
    FAMILIES,
    REDUCE_SCATTER,
    RING_REDUCE_SCATTER,
    CollectiveCost,
    Layout,
    Link,
    Network,
    bus_bandwidth,
    capped,
    family_named,
    family_of,
    traffic_size,
)
from mpi_train.sync import SYNC_METHODS, SyncMethod
from mpi_train.sync.traits import Traits

MB = 1e6
NET = Network(intra=Link(alpha=10e-6, beta=1 / 1e9), inter=Link(alpha=100e-6, beta=1 / 125e6))  # 1 GB/s, 1 Gbit/s


def test_traffic_and_floors_follow_the_closed_forms():
    ring, root = FAMILIES["ring_allreduce"], FAMILIES["root"]
    assert ring.traffic(8 * MB, 4, 2) == (12 * MB, 12 * MB)  # 2(N-1)/N·S
    assert root.traffic(8 * MB, 4, 0) == (24 * MB, 24 * MB)  # the root: (N-1)·S each way
    assert root.traffic(8 * MB, 4, 3) == (8 * MB, 8 * MB)
    assert ring.floor(8 * MB, 4, 1e9) == pytest.approx(0.012) and root.floor(8 * MB, 4, 1e9) == pytest.approx(0.048)
    hierarchical, two_hosts = FAMILIES["two_level"], ("a", "a", "b", "b")
    assert hierarchical.traffic(8 * MB, 4, 2, two_hosts) == (8 * MB, 8 * MB)  # a leader: 2(H-1)/H·S between hosts
    assert hierarchical.traffic(8 * MB, 4, 3, two_hosts) == (0.0, 0.0)  # the others stay within their host
    assert hierarchical.floor(8 * MB, 4, 1e9, two_hosts) == pytest.approx(0.008)
    assert hierarchical.traffic(8 * MB, 4, 1, ("a",) * 4) == ring.traffic(8 * MB, 4, 1)  # one host: plain allreduce
    assert bus_bandwidth(8 * MB, 4, 0.012) == pytest.approx(1e9)  # a ring at its floor runs at the link's speed


def test_ring_on_two_hosts_pays_the_inter_host_link():
    ring = FAMILIES["ring_allreduce"].time
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
    assert FAMILIES["two_level"].time(8 * MB, Layout(8, 4), NET) == pytest.approx(expected)
    one_per_host, ring = Layout(4, 1), FAMILIES["ring_allreduce"]
    assert FAMILIES["two_level"].time(8 * MB, one_per_host, NET) == ring.time(8 * MB, one_per_host, NET)


def test_every_registered_method_names_a_known_family():
    for name, method_class in SYNC_METHODS.items():
        assert family_of(method_class) is not None, name


def test_an_unknown_family_is_refused_with_where_to_look():
    class Misnamed(SyncMethod):
        traits = Traits(family="tree")

    with pytest.raises(ValueError, match="Misnamed.traits.family = 'tree'.*families.py"):
        family_of(Misnamed)
    assert family_of(SyncMethod) is None


def test_the_sharded_families_move_two_or_three_halves_of_a_ring():
    rs, layerwise, broadcast = (FAMILIES[name] for name in ("reduce_scatter", "layerwise_gather",
                                                             "ring_then_broadcast"))
    assert rs.traffic(8 * MB, 4, 1) == (12 * MB, 12 * MB)  # reduce-scatter 6 MB + all-gather 6 MB: a ring's bytes
    assert layerwise.traffic(8 * MB, 4, 0) == (18 * MB, 18 * MB)  # 3(N-1)/N·S
    assert broadcast.traffic(8 * MB, 4, 3) == (18 * MB, 18 * MB)  # allreduce 12 MB, then the owners' 6 MB
    assert rs.floor(8 * MB, 4, 1e9) == pytest.approx(0.012)
    assert layerwise.floor(8 * MB, 4, 1e9) == pytest.approx(0.018) == broadcast.floor(8 * MB, 4, 1e9)


def test_what_the_parts_carry_sets_the_bytes_a_sharded_family_moves():
    rs, layerwise, broadcast, ring = (FAMILIES[name] for name in ("reduce_scatter", "layerwise_gather",
                                                                   "ring_then_broadcast", "ring_allreduce"))
    # fsdp gathering bfloat16 copies (4 MB) of 8 MB of float32 parameters, reduce-scattering float32 gradients:
    # 2 x 4 + 8 = 16 MB in halves of a ring, against 24 MB all in float32
    moved = traffic_size(layerwise, 8 * MB, 4 * MB)
    assert layerwise.traffic(moved, 4, 0) == (12 * MB, 12 * MB)
    assert layerwise.floor(moved, 4, 1e9) == pytest.approx(0.012)
    # zero+fp16: a 4 MB reduce-scatter, the float32 parameters' 8 MB all-gather
    assert rs.traffic(traffic_size(rs, 4 * MB, 8 * MB), 4, 1) == (9 * MB, 9 * MB)
    assert traffic_size(layerwise, 8 * MB, 8 * MB) == traffic_size(layerwise, 8 * MB) == 8 * MB
    assert traffic_size(broadcast, 8 * MB, 4 * MB) == 8 * MB  # none of its parts carries the parameters apart
    assert traffic_size(ring, 8 * MB, 1 * MB) == 8 * MB  # one collective: the wire's bytes


def test_the_sharded_families_price_each_collective_apart():
    # N=4 on 2 hosts: one reduce-scatter or all-gather of 8 MB = 3 alpha + 3/4 S beta on the inter-host link
    half = 3 * 100e-6 + 6 * MB / 125e6
    rs = FAMILIES["reduce_scatter"]
    assert [(p.name, p.when) for p in rs.collectives()] == [("reduce-scatter", "with the message"),
                                                             ("all-gather", "before the next forward")]
    assert [p.compressed for p in rs.collectives()] == [True, False]  # the gather carries the parameters as they are
    assert [p.time(8 * MB, Layout(4, 2), NET) for p in rs.collectives()] == pytest.approx([half, half])
    ring = FAMILIES["ring_allreduce"]
    assert rs.time(8 * MB, Layout(4, 2), NET) == pytest.approx(ring.time(8 * MB, Layout(4, 2), NET))
    layerwise = FAMILIES["layerwise_gather"]
    assert [p.when for p in layerwise.collectives()] == ["in forward", "with the message", "with the message"]
    assert layerwise.time(8 * MB, Layout(4, 2), NET) == pytest.approx(3 * half)
    # allreduce (6 alpha + 12 MB beta), then 4 broadcasts of 2 MB down a binomial tree: 4·2 alpha + 2·8 MB beta
    then = FAMILIES["ring_then_broadcast"]
    assert then.time(8 * MB, Layout(4, 2), NET) == pytest.approx(600e-6 + 12 * MB / 125e6 + 800e-6 + 16 * MB / 125e6)
    assert all(family.time(8 * MB, Layout(1, 1), NET) == 0 for family in (rs, layerwise, then))
    # a one-collective family is one allreduce that goes with the message
    assert [(p.name, p.when) for p in FAMILIES["ring_allreduce"].collectives()] == [("allreduce", "with the message")]


def test_measured_collectives_price_the_sharded_families_as_the_backend_ran_them():
    # Gloo-like: a reduce-scatter's ring step pays 2 ms and its bytes 3x the link's, an all-gather's 1 ms and 1.5x.
    # N=4 on 2 hosts, S=8 MB, inter-host 125 MB/s: 3 steps and 3/4·S = 6 MB at 48 ms
    rs_cost = CollectiveCost(REDUCE_SCATTER, alpha=2e-3, beta_factor=3.0)
    ag_cost = CollectiveCost(ALL_GATHER, alpha=1e-3, beta_factor=1.5)
    measured = replace(NET, collectives=(rs_cost, ag_cost))
    rs_s, ag_s = 3 * 2e-3 + 3.0 * 0.048, 3 * 1e-3 + 1.5 * 0.048
    assert rs_cost.time(8 * MB, 4, NET.inter) == pytest.approx(rs_s)
    zero = FAMILIES["reduce_scatter"]
    assert [p.time(8 * MB, Layout(4, 2), measured) for p in zero.collectives()] == pytest.approx([rs_s, ag_s])
    assert zero.time(8 * MB, Layout(4, 2), measured) == pytest.approx(rs_s + ag_s)
    layerwise = FAMILIES["layerwise_gather"]  # two gathers and a reduce-scatter per unit
    assert [p.measured for p in layerwise.collectives()] == [(ALL_GATHER,), (ALL_GATHER,), (REDUCE_SCATTER,)]
    assert layerwise.time(8 * MB, Layout(4, 2), measured) == pytest.approx(2 * ag_s + rs_s)
    # one host: the measured step latency and factor on the intra-host link (1 GB/s)
    assert zero.collectives()[0].time(8 * MB, Layout(4, 4), measured) == pytest.approx(6e-3 + 3.0 * 6 * MB / 1e9)
    # the allreduce and ZeRO-1's families are not the sharded collectives: unchanged
    for name in ("ring_allreduce", "ring_then_broadcast"):
        assert FAMILIES[name].time(8 * MB, Layout(4, 2), measured) == FAMILIES[name].time(8 * MB, Layout(4, 2), NET)
    # zero's own ring reduce-scatter (Gloo), where the calibration timed it, prices zero's and not fsdp's: 1 ms a step
    # and 1.1x a ring's bytes
    ring = replace(measured, collectives=(rs_cost, ag_cost, CollectiveCost(RING_REDUCE_SCATTER, 1e-3, 1.1)))
    assert zero.collectives()[0].time(8 * MB, Layout(4, 2), ring) == pytest.approx(3e-3 + 1.1 * 0.048)
    assert layerwise.collectives()[2].time(8 * MB, Layout(4, 2), ring) == pytest.approx(rs_s)
    # the network keeps them through a cap and without a straggler, and through its dict form
    assert capped(measured, "100mbit").collectives == measured.collectives == measured.without_slow().collectives
    assert Network.from_dict(measured.as_dict()) == measured and "collectives" not in NET.as_dict()


def test_a_family_is_named_apart_from_the_methods_and_a_stored_method_name_reads_back():
    assert not set(FAMILIES) & set(SYNC_METHODS)
    assert family_named("ring") is FAMILIES["ring_allreduce"] and family_named("hierarchical") is FAMILIES["two_level"]
    assert family_named("reduce_scatter") is FAMILIES["reduce_scatter"]
