"""Links and networks: rates as tc writes them, the least-squares fit, the cap a shaped rate puts on a burst."""

import pytest

from mpi_train.netmodel import Link, Network, capped, rate_bytes_per_s

NET = Network(intra=Link(alpha=10e-6, beta=1 / 1e9), inter=Link(alpha=100e-6, beta=1 / 125e6))  # 1 GB/s, 1 Gbit/s


def test_rates_parse_like_tc_and_bad_ones_are_refused():
    assert rate_bytes_per_s("1gbit") == 125e6
    assert rate_bytes_per_s("100mbit") == 12.5e6
    assert rate_bytes_per_s("unlimited") is None
    with pytest.raises(ValueError, match="10gbit"):
        rate_bytes_per_s("fast")
    assert rate_bytes_per_s("1kbit") == 125
    with pytest.raises(ValueError, match="below 1kbit"):
        rate_bytes_per_s("0.000001bit")  # a step of 5.8e16 ms, printed without a word


def test_the_fit_recovers_alpha_and_beta_of_exact_points():
    sizes = [1e3, 4e3, 16e3, 64e3, 1e6]
    link = Link.fit(sizes, [50e-6 + s / 1e8 for s in sizes])
    assert link.alpha == pytest.approx(50e-6, rel=1e-6) and link.beta == pytest.approx(1e-8, rel=1e-6)
    assert link.fit_error == pytest.approx(0, abs=1e-9)
    noisy = Link.fit(sizes, [(50e-6 + s / 1e8) * f for s, f in zip(sizes, (1.1, 0.9, 1.1, 0.9, 1.0))])
    assert 0.05 < noisy.fit_error < 0.15  # about the 10% put in


def test_a_network_round_trips_through_its_dict():
    slow = Network(NET.intra, NET.inter, Link(1e-3, 1 / 1e6), slow_is_root=True)
    assert Network.from_dict(slow.as_dict()) == slow and Network.from_dict(NET.as_dict()) == NET
    assert slow.slowest == slow.slow and NET.slowest == NET.inter and slow.without_slow() == NET


def test_a_shaped_rate_caps_the_inter_host_bandwidth_a_burst_overstates():
    fast = Network(intra=NET.intra, inter=Link(alpha=100e-6, beta=1 / 155e6))
    assert capped(fast, "1gbit").inter.beta == pytest.approx(1 / 125e6)
    assert capped(fast, "10gbit") == fast and capped(fast, None) == fast
    assert capped(fast, "1gbit").intra == fast.intra
