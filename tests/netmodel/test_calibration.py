"""Calibration: the sizes timed, the peers chosen, and a bench JSON's links read back (or refused)."""

import json
from dataclasses import replace

import pytest

from mpi_train.errors import UserError
from mpi_train.netmodel import (
    FAMILIES,
    Backward,
    Layout,
    Link,
    Network,
    calibration_sizes,
    collective_costs,
    load_backward,
    load_calibration,
)
from mpi_train.netmodel.calibration import peers

NET = Network(intra=Link(alpha=10e-6, beta=1 / 1e9), inter=Link(alpha=100e-6, beta=1 / 125e6))


def test_the_calibration_sizes_and_peers():
    assert calibration_sizes(100_000) == [1024, 4096, 16384, 65536, 100_000]
    assert peers(["a", "a", "b"]) == {"intra": 1, "inter": 2}
    assert peers(["a", "b"]) == {"intra": None, "inter": 1}


def test_a_calibration_file_round_trips_and_a_bad_one_is_refused(tmp_path):
    good = tmp_path / "bench.json"
    backward = Backward(0.6, (0.5, 0.1), (1, 0))
    good.write_text(json.dumps({"calibration": {"network": NET.as_dict(), "backward": backward.as_dict()}}))
    assert load_calibration(good) == NET
    assert load_backward(good, 2) == backward and load_backward(good, 3) == Backward()  # another model: assumed
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(UserError, match="is not a bench's JSON"):
        load_calibration(bad)
    bad.write_text('{"calibration": {"network": 3}}')  # a bench's, damaged
    with pytest.raises(UserError, match="cannot be used: its links cannot be read"):
        load_calibration(bad)
    bad.write_text(json.dumps({"calibration": {"network": {**NET.as_dict(), "inter": {"alpha": 0, "beta": -1}}}}))
    with pytest.raises(UserError, match=r"its inter-host link has alpha 0 s and beta -1 s/byte"):
        load_calibration(bad)  # once priced a negative time for every message
    with pytest.raises(UserError, match="cannot read the calibration file"):
        load_calibration(tmp_path / "missing.json")


def test_a_bench_s_fits_of_the_sharded_collectives_become_the_network_s_measured_costs(tmp_path):
    # 4 ranks on 2 hosts over a 125 MB/s link: a reduce-scatter fitted at 6 ms + S·6e-8 s/B holds 2 ms per ring step
    # and 6e-8 / (3/4 · 8e-9) = 10x a ring's bytes; priced back on that layout it is the fit again
    fits = {"reduce_scatter": {"alpha": 6e-3, "beta": 6e-8}, "all_gather": {"alpha": 3e-3, "beta": 1.2e-8},
            "allreduce": {"alpha": 1e-3, "beta": 1.6e-8}}
    layout = Layout(4, 2)
    allreduce, rs, ag = collective_costs(fits, layout, NET)
    assert (rs.name, rs.alpha, rs.beta_factor) == pytest.approx(("reduce_scatter", 2e-3, 10.0))
    # the allreduce runs two half-rings: 6 steps of 1/6 ms, and 1.6e-8 / (2 · 3/4 · 8e-9) = 4/3 a ring's bytes; the
    # ring family (every allreduce method) then pays the fit itself on this layout
    assert (allreduce.name, allreduce.alpha, allreduce.beta_factor) == pytest.approx(("allreduce", 1e-3 / 6, 4 / 3))
    assert allreduce.time(8e6, 4, NET.inter) == pytest.approx(1e-3 + 8e6 * 1.6e-8)
    priced = replace(NET, collectives=(allreduce,))
    assert FAMILIES["ring_allreduce"].time(8e6, layout, priced) == pytest.approx(1e-3 + 8e6 * 1.6e-8)
    assert (ag.name, ag.alpha, ag.beta_factor) == pytest.approx(("all_gather", 1e-3, 2.0))
    assert rs.time(8e6, 4, NET.inter) == pytest.approx(6e-3 + 8e6 * 6e-8)
    # one host: held against the intra-host link (1 GB/s): 6e-8 / (3/4 · 1e-9) = 80x
    assert collective_costs(fits, Layout(4, 4), NET)[1].beta_factor == pytest.approx(80.0)
    assert collective_costs(fits, Layout(1, 1), NET) == () and collective_costs({}, layout, NET) == ()
    # a bench JSON: read back with its layout; one written before the bench fitted the sharded ones has the allreduce
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"world_size": 4, "layout": {"hosts": 2, "ranks_per_host": 2},
                                 "calibration": {"network": NET.as_dict(), **fits}}))
    assert load_calibration(bench).collectives == (allreduce, rs, ag)
    bench.write_text(json.dumps({"world_size": 4, "layout": {"hosts": 2, "ranks_per_host": 2},
                                 "calibration": {"network": NET.as_dict(), "allreduce": fits["allreduce"]}}))
    assert load_calibration(bench) == replace(NET, collectives=(allreduce,))  # the sharded ones at a ring's bytes
