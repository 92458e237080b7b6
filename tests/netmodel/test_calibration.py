"""Calibration: the sizes timed, the peers chosen, and a bench JSON's links read back (or refused)."""

import json

import pytest

from mpi_train.errors import UserError
from mpi_train.netmodel import Backward, Link, Network, calibration_sizes, load_backward, load_calibration
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
    with pytest.raises(UserError, match="no fitted links"):
        load_calibration(bad)
    with pytest.raises(UserError, match="cannot read the calibration file"):
        load_calibration(tmp_path / "missing.json")
