"""The alpha-beta model's formulas against hand computations."""

import pytest

from mpi_train import netmodel
from mpi_train.netmodel import Link, Network, Placement, Schedule, predict
from mpi_train.sync import SYNC_METHODS

MB = 1e6
NET = Network(intra=Link(alpha=10e-6, beta=1 / 1e9), inter=Link(alpha=100e-6, beta=1 / 125e6))  # 1 GB/s, 1 Gbit/s


def test_rates_parse_like_tc_and_bad_ones_are_refused():
    assert netmodel.rate_bytes_per_s("1gbit") == 125e6
    assert netmodel.rate_bytes_per_s("100mbit") == 12.5e6
    assert netmodel.rate_bytes_per_s("unlimited") is None
    with pytest.raises(ValueError, match="10gbit"):
        netmodel.rate_bytes_per_s("fast")


def test_the_fit_recovers_alpha_and_beta_of_exact_points():
    sizes = [1e3, 4e3, 16e3, 64e3, 1e6]
    link = Link.fit(sizes, [50e-6 + s / 1e8 for s in sizes])
    assert link.alpha == pytest.approx(50e-6, rel=1e-6) and link.beta == pytest.approx(1e-8, rel=1e-6)
    assert link.fit_error == pytest.approx(0, abs=1e-9)
    noisy = Link.fit(sizes, [(50e-6 + s / 1e8) * f for s, f in zip(sizes, (1.1, 0.9, 1.1, 0.9, 1.0))])
    assert 0.05 < noisy.fit_error < 0.15  # about the 10% put in


def test_ring_on_two_hosts_pays_the_inter_host_link():
    # N=4, 2 per host, S=8 MB: 2(N-1) alpha + 2(N-1)/N S beta = 6*100us + 12 MB / 125 MB/s
    assert netmodel.ring_time(8 * MB, Placement(4, 2), NET) == pytest.approx(600e-6 + 0.096)
    # one host: the intra link, 6*10us + 12 MB / 1 GB/s
    assert netmodel.ring_time(8 * MB, Placement(4, 4), NET) == pytest.approx(60e-6 + 0.012)
    assert netmodel.ring_time(8 * MB, Placement(1, 1), NET) == 0


def test_root_moves_everything_through_rank_0s_host_link():
    # N=8 on 4 hosts of 2: 14 alphas, 2*(6 S over the inter link + 1 S in memory)
    expected = 14 * 100e-6 + 2 * (6 * 8 * MB / 125e6 + 1 * 8 * MB / 1e9)
    assert netmodel.root_time(8 * MB, Placement(8, 2), NET) == pytest.approx(expected)


def test_per_tensor_methods_pay_one_latency_per_tensor_and_flat_one():
    tensors = [1 * MB] * 10
    per_tensor = predict("allreduce", SYNC_METHODS["allreduce"], tensors, Placement(2, 1), NET)
    flat = predict("flat", SYNC_METHODS["flat"], tensors, Placement(2, 1), NET)
    assert per_tensor.messages == 10 and flat.messages == 1
    assert per_tensor.comm_s - flat.comm_s == pytest.approx(9 * 2 * 100e-6)  # nine more calls of 2(N-1) alphas


def test_a_float16_wire_halves_the_bytes():
    tensors = [4 * MB]
    fp16 = predict("flat_fp16", SYNC_METHODS["flat_fp16"], tensors, Placement(2, 1), NET)
    assert fp16.wire_bytes == 2 * MB
    assert fp16.comm_s == pytest.approx(2 * 100e-6 + 2 * MB / 125e6)


def test_buckets_fill_in_backward_order_and_hide_behind_backward():
    # DDP's rule: a bucket closes once it reaches its cap (60 bytes here, the first one too), last tensor first
    assert netmodel.messages([10, 20, 30, 40], Schedule("buckets", bucket_mb=60 / 2**20)) == [70.0, 30.0]  # 40+30 | 20+10
    first_small = Schedule("buckets", bucket_mb=100 / 2**20, first_bucket_mb=30 / 2**20)
    assert netmodel.messages([10, 20, 30, 40], first_small) == [40.0, 60.0]  # 40 | 30+20+10
    # two buckets of 1 s each, backward 2 s: the first is ready at 1 s, ends at 2 s; the second ready at 2, ends at 3
    assert netmodel.exposed_time([1.0, 1.0], [1.0, 2.0], 2.0) == pytest.approx(1.0)
    assert netmodel.exposed_time([0.1, 0.1], [1.0, 2.0], 2.0) == pytest.approx(0.1)  # only the last bucket shows
    assert netmodel.exposed_time([0.5, 0.5], [0.2, 0.4], 2.0) == pytest.approx(0.0)  # both done before backward ends
    bucketed = predict("bucketed", SYNC_METHODS["bucketed"], [1 * MB] * 4, Placement(2, 1), NET, backward_s=10.0)
    assert bucketed.overlapped and bucketed.exposed_s < bucketed.comm_s and bucketed.sync_s == bucketed.exposed_s


def test_a_measured_backward_says_when_each_bucket_can_leave():
    assumed = netmodel.Backward()  # bytes at a constant rate, last tensor first
    assert assumed.ready_times([10, 30], 2.0) == pytest.approx([2.0, 1.5])
    measured = netmodel.Backward(0.7, (0.9, 0.1))
    assert measured.ready_times([10, 30], 2.0) == pytest.approx([1.8, 0.2])
    assert netmodel.Backward.from_dict(measured.as_dict()) == measured and netmodel.Backward.from_dict(None) == assumed
    # 4 tensors of 1 MB in two 2 MB buckets (the last two tensors first), each 0.5 s on a 4 MB/s link at np 2
    slow = netmodel.Network(netmodel.LOOPBACK, netmodel.Link(0.0, 1 / 4e6))
    sizes, place, schedule = [1 * MB] * 4, Placement(2, 1), dict(backward_s=2.0, bucket_mb=2 * MB / 2**20)
    late = predict("bucketed", SYNC_METHODS["bucketed"], sizes, place, slow, **schedule)  # ready at 1 s and 2 s
    early = predict("bucketed", SYNC_METHODS["bucketed"], sizes, place, slow,
                    backward=netmodel.Backward(0.7, (0.2, 0.2, 0.1, 0.1)), **schedule)  # ready at 0.2 s and 0.4 s
    assert late.messages == early.messages == 2 and late.comm_s == pytest.approx(early.comm_s) == pytest.approx(1.0)
    assert late.exposed_s == pytest.approx(0.5)  # the second bucket leaves when backward ends
    assert early.exposed_s == pytest.approx(0.0)  # both are through by 1.2 s, well before backward ends at 2 s


@pytest.mark.parametrize("model_name", ["vgg11", "mnist_cnn"])
def test_bucketed_cuts_buckets_as_ddp_does(model_name):
    """The same buckets as DistributedDataParallel's default (1 MB first, then 25 MB), so the two compare fairly."""
    import torch.distributed as dist

    from mpi_train.models import build_model
    from mpi_train.sync.bucketed import Bucketed

    params = [p for p in build_model(model_name).parameters()][::-1]
    ddp_buckets, _ = dist._compute_bucket_assignment_by_size(params, [2**20, 25 * 2**20], [False] * len(params))
    ours = Bucketed().split(params)
    assert [[id(p) for p in group] for group in ours] == [[id(params[i]) for i in group] for group in ddp_buckets]
    assert len(ours) > 1


def test_a_method_without_a_known_cost_model_gets_no_prediction():
    class Unmodelled:
        cost_model = None

    assert predict("x", Unmodelled, [1.0], Placement(2, 1), NET) is None


def test_placement_of_a_job_and_the_calibration_sizes():
    placement = Placement.of_hosts(["a", "a", "b", "b", "c"])
    assert (placement.world, placement.ranks_per_host, placement.hosts) == (5, 2, 3)
    assert netmodel.calibration_sizes(100_000) == [1024, 4096, 16384, 65536, 100_000]
    assert netmodel.peers(["a", "a", "b"]) == {"intra": 1, "inter": 2}
    assert netmodel.peers(["a", "b"]) == {"intra": None, "inter": 1}


def test_a_calibration_file_round_trips_and_a_bad_one_is_refused(tmp_path):
    good = tmp_path / "bench.json"
    good.write_text(__import__("json").dumps({"calibration": {"network": NET.as_dict()}}))
    assert netmodel.load_calibration(good) == NET
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(netmodel.UserError, match="no fitted links"):
        netmodel.load_calibration(bad)


def test_a_shaped_rate_caps_the_inter_host_bandwidth_a_burst_overstates():
    fast = Network(intra=NET.intra, inter=Link(alpha=100e-6, beta=1 / 155e6))
    assert netmodel.capped(fast, "1gbit").inter.beta == pytest.approx(1 / 125e6)
    assert netmodel.capped(fast, "10gbit") == fast and netmodel.capped(fast, None) == fast
    assert netmodel.capped(fast, "1gbit").intra == fast.intra
