"""The advisor's search: every bucket size that cuts the gradients differently, each method predicted on a synthetic
network, the shortlist it measures, and Kendall's tau of its ranking."""

import pytest

from mpi_train.advice import search
from mpi_train.advice.search import Candidate, StepModel
from mpi_train.netmodel import ASSUMED_BACKWARD, Backward, Layout, Link, Network
from mpi_train.sync.messages import BUCKETS, message_groups

MIB = 2**20
LOOPBACK = Link(alpha=50e-6, beta=1 / 2e9)
SLOW = Network(LOOPBACK, Link(alpha=150e-6, beta=1 / 12.5e6))  # 100 Mbit/s between hosts
FAST = Network(LOOPBACK, Link(alpha=100e-6, beta=1 / 1.25e9))  # 10 Gbit/s


def groups(tensor_bytes, bucket_mb):
    """The buckets bucketed cuts at this --bucket-mb (its first bucket at most 1 MB)."""
    caps = Candidate("bucketed", bucket_mb).method().traits.bucket_caps
    return message_groups(tensor_bytes, BUCKETS, caps)


def step_model(tensor_bytes, network, compute_s=1.0):
    """4 ranks on 2 hosts, the step without sync 10 ms longer than forward + backward."""
    return StepModel(tuple(tensor_bytes), Layout(4, 2), network, ASSUMED_BACKWARD, compute_s, compute_s + 0.01)


def test_the_bucket_sizes_are_every_distinct_cut_at_its_roundest_size():
    tensors = [1 * MIB, 2 * MIB, 3 * MIB, 4 * MIB]  # backward hands them over last first: 4, 3, 2, 1 MB
    # the sums of consecutive gradients are 1, 2, 3, 4, 5, 6, 7, 9, 10 MB; above 9 every size cuts as the whole model
    assert search.bucket_sizes(tensors) == [1, 2, 3, 4, 5, 6, 7, 9, 25]
    found = search.candidates(["bucketed", "ddp"], tensors)
    assert found[-1] == Candidate("ddp")  # ddp's buckets are torch's: one candidate
    sizes = [candidate.bucket_mb for candidate in found[:-1]]
    # 4 | 3 | 2 | 1, 4 | 3 | 2+1, 4 | 3+2 | 1, 4 | 3+2+1 (the first bucket holds 1 MB at most): the largest round size
    assert sizes == [2, 3, 5, 25]
    cuts = [str(groups(tensors, size)) for size in sizes]
    scanned = {str(groups(tensors, mb / 100)) for mb in range(1, 4000)}  # 0.01 .. 40 MB
    assert len(set(cuts)) == len(cuts) and scanned == set(cuts)  # each a different cut, and no other exists


@pytest.mark.parametrize("low, high, roundest", [(7.2, 8.4, 8), (18.3, 27.1, 25), (0.30001, 0.3002, 0.3002),
                                                 (35.2, float("inf"), 40), (0.0, 0.00003, 3e-05), (5.0, 5.0, None)])
def test_each_range_of_sizes_is_named_by_its_roundest(low, high, roundest):
    assert search.roundest(low, high) == roundest


def test_the_search_finds_what_a_dense_scan_of_bucket_sizes_finds():
    tensors = [0.3 * MIB, 6 * MIB, 0.1 * MIB, 9 * MIB, 0.2 * MIB, 4 * MIB, 0.05 * MIB, 2 * MIB]
    network = Network(LOOPBACK, Link(alpha=2e-3, beta=1 / 50e6))  # a latency that makes small buckets costly
    model = step_model(tensors, network, compute_s=0.6)
    best = next(one for one in search.best_of_each(search.ranked(search.candidates(["bucketed"], tensors), model)))
    dense = [search.predicted(Candidate("bucketed", mb / 50), model).step_s for mb in range(1, 1500)]  # to 30 MB
    assert best.step_s <= min(dense) * (1 + search.TIE)
    assert best.candidate.bucket_mb not in (1, 5, 25) and best.step_s < min(  # a fixed list would have missed it
        search.predicted(Candidate("bucketed", mb), model).step_s for mb in (1, 5, 25))


def test_on_a_slow_link_between_hosts_only_the_host_leaders_crossing_it_wins_but_zeros_hidden_gathers():
    tensors = [2 * MIB] * 10
    ranking = search.ranked(search.candidates(search.lossless("gloo")[0], tensors), step_model(tensors, SLOW))
    best = search.best_of_each(ranking)
    # of the methods that keep every gradient, the one whose host leaders alone cross the slow link; zero moves a
    # ring's bytes across it but hides its reduce-scatters behind backward and its gathers behind the next forward
    assert [one.candidate.sync for one in best[:3]] == ["zero", "hierarchical", "bucketed"]
    assert best[0].exposed_s < best[1].exposed_s < best[0].comm_s
    assert best[-1].candidate == Candidate("gather_scatter")
    flat = next(one for one in best if one.candidate.sync == "flat")
    assert flat.step_s == pytest.approx(1.01 + 2 * 3 * 150e-6 + 2 * 3 / 4 * 20 * MIB / 12.5e6)  # baseline + ring
    assert flat.exposed_s == flat.comm_s and "between-host link (12.5 MB/s, 150 us" in flat.binds


def test_where_backward_hides_the_messages_nothing_binds():
    tensors = [1 * MIB] * 8
    early = Backward(2 / 3, tuple(0.5 - i / 20 for i in range(8)))  # every gradient ready halfway through backward
    model = StepModel(tuple(tensors), Layout(4, 2), FAST, early, 3.0, 3.01)
    best = search.best_of_each(search.ranked(search.candidates(["bucketed", "ddp"], tensors), model))[0]
    assert best.exposed_s == 0 < best.comm_s and best.binds.startswith("nothing")
    late = search.predicted(Candidate("flat"), model)  # after backward: all of it exposed, on the link between hosts
    assert late.exposed_s == late.comm_s > 0 and late.binds.startswith("the between-host link")


def test_the_lossless_methods_are_read_from_the_registry():
    usable, refused = search.lossless("gloo")
    assert usable == ["gather_scatter", "allreduce", "ddp", "flat", "bucketed", "ring", "hierarchical", "zero", "fsdp",
                      "zero_torch"]  # the sharded methods too: the advisor weighs their memory against their time
    assert refused == []  # ddp_powersgd, refused on Gloo, is lossy: listed by the advisor apart
    assert search.follows_bucket_size("bucketed") and not search.follows_bucket_size("ddp")
    assert Candidate("bucketed", 8.0).flags == ["--sync", "bucketed", "--bucket-mb", "8"]
    assert Candidate("ddp").flags == ["--sync", "ddp"] and Candidate("bucketed", 0.5).label == "bucketed@0.5MB"


def test_the_shortlist_holds_the_best_methods_ddp_and_the_default_bucket_size():
    tensors = [1 * MIB, 2 * MIB, 3 * MIB, 4 * MIB]
    ranking = search.ranked(search.candidates(search.lossless("gloo")[0], tensors), step_model(tensors, SLOW))
    best = search.best_of_each(ranking)
    chosen = search.shortlist(ranking, 2)
    assert chosen[:2] == [one.candidate for one in best[:2]] and Candidate("ddp") in chosen
    bucketed = [c for c in chosen if c.sync == "bucketed"]
    assert not bucketed or Candidate("bucketed", 25.0) in bucketed
    assert len(chosen) == len(set(chosen)) <= 4


def test_kendall_tau():
    assert search.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1
    assert search.kendall_tau([1, 2, 3], [3, 2, 1]) == -1
    assert search.kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert search.kendall_tau([1], [2]) is None


def test_the_full_bench_grid_holds_every_method_the_bench_sizes_and_what_the_advice_measured():
    tensors = [1 * MIB, 2 * MIB, 3 * MIB, 4 * MIB]
    found = search.candidates(search.lossless("gloo")[0], tensors)
    advised = [Candidate("bucketed", 3.0), Candidate("ddp"), Candidate("bucketed", 25.0)]
    grid = search.full_grid(found, advised)
    assert len(grid) == len(set(grid))
    assert {c.sync for c in grid} == {c.sync for c in found}  # every method
    assert [c.bucket_mb for c in grid if c.sync == "bucketed"] == [*search.FULL_BENCH_MB, 3.0]  # the grid, then 3 MB
    assert all(c in grid for c in advised)
