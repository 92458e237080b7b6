"""A method's messages priced on a network, by its class attributes: per tensor, one buffer, buckets behind backward."""

import pytest

from mpi_train.config import TrainConfig
from mpi_train.netmodel import ASSUMED_BACKWARD, Backward, Layout, Link, Network, message_plan, predict
from mpi_train.sync import SYNC_METHODS, SyncMethod
from mpi_train.sync.messages import BUCKETS, ONE_BUFFER, PER_TENSOR, message_groups

MB = 1e6
NET = Network(intra=Link(alpha=10e-6, beta=1 / 1e9), inter=Link(alpha=100e-6, beta=1 / 125e6))  # 1 GB/s, 1 Gbit/s


def method(name: str, **options) -> SyncMethod:
    return SYNC_METHODS[name].from_config(TrainConfig(sync=name, **options))


def test_per_tensor_methods_pay_one_latency_per_tensor_and_flat_one():
    tensors = [1 * MB] * 10
    per_tensor = predict(method("allreduce"), tensors, Layout(2, 1), NET)
    flat = predict(method("flat"), tensors, Layout(2, 1), NET)
    assert per_tensor.messages == 10 and flat.messages == 1
    assert per_tensor.comm_s - flat.comm_s == pytest.approx(9 * 2 * 100e-6)  # nine more calls of 2(N-1) alphas


def test_a_float16_wire_halves_the_bytes():
    fp16 = predict(method("flat_fp16"), [4 * MB], Layout(2, 1), NET)
    assert fp16.wire_bytes == 2 * MB
    assert fp16.comm_s == pytest.approx(2 * 100e-6 + 2 * MB / 125e6)


def test_a_second_round_of_sums_pays_the_latency_again():
    once = predict(method("flat"), [4 * MB], Layout(2, 1), NET, ratio=0.1)
    twice = predict(method("flat", compression="powersgd"), [4 * MB], Layout(2, 1), NET, ratio=0.1)
    assert twice.wire_bytes == once.wire_bytes and twice.comm_s - once.comm_s == pytest.approx(2 * 100e-6)


def test_buckets_fill_in_backward_order():
    # DDP's rule: a bucket closes once it reaches its cap (60 bytes here, the first one too), last tensor first
    assert message_groups([10, 20, 30, 40], BUCKETS, (60, 60)) == [[3, 2], [1, 0]]
    assert message_groups([10, 20, 30, 40], BUCKETS, (30, 100)) == [[3], [2, 1, 0]]
    assert message_groups([10, 20, 30, 40], BUCKETS, (30, 100), order=[2, 3, 0, 1]) == [[2], [3, 0, 1]]  # as measured
    assert message_groups([10, 20], PER_TENSOR) == [[0], [1]] and message_groups([10, 20], ONE_BUFFER) == [[0, 1]]


def test_buckets_hide_behind_backward():
    # two buckets of 0.5 s each on a 4 MB/s link at np 2, backward 2 s: ready at 1 s and 2 s (bytes at a constant
    # rate, last tensor first); the second waits for backward's end, so 0.5 s outlast it
    slow = Network(NET.intra, Link(0.0, 1 / 4e6))
    plan = message_plan(method("bucketed", bucket_mb=2 * MB / 2**20), [1 * MB] * 4, Layout(2, 1), slow, backward_s=2.0)
    assert [(m.tensors, m.ready_s, m.start_s, m.end_s) for m in plan] == [
        ((3, 2), 1.0, 1.0, 1.5), ((1, 0), 2.0, 2.0, 2.5)]
    flat = message_plan(method("flat"), [1 * MB] * 4, Layout(2, 1), slow, backward_s=2.0)  # after backward: at 2 s
    assert [(m.start_s, m.end_s) for m in flat] == [(2.0, 3.0)]
    bucketed = predict(method("bucketed"), [1 * MB] * 4, Layout(2, 1), NET, backward_s=10.0)
    assert bucketed.overlapped and bucketed.exposed_s < bucketed.comm_s and bucketed.sync_s == bucketed.exposed_s


def test_a_measured_backward_says_when_each_bucket_can_leave():
    assert ASSUMED_BACKWARD.ready_times([10, 30], 2.0) == pytest.approx([2.0, 1.5])  # bytes at a constant rate
    measured = Backward(0.7, (0.9, 0.1), (1, 0))
    assert measured.ready_times([10, 30], 2.0) == pytest.approx([1.8, 0.2])
    assert Backward.from_dict(measured.as_dict()) == measured and Backward.from_dict(None) == ASSUMED_BACKWARD
    # 4 tensors of 1 MB in two 2 MB buckets (the last two tensors first), each 0.5 s on a 4 MB/s link at np 2
    slow = Network(NET.intra, Link(0.0, 1 / 4e6))
    bucketed = method("bucketed", bucket_mb=2 * MB / 2**20)
    late = predict(bucketed, [1 * MB] * 4, Layout(2, 1), slow, backward_s=2.0)  # ready at 1 s and 2 s
    early = predict(bucketed, [1 * MB] * 4, Layout(2, 1), slow, backward_s=2.0,
                    backward=Backward(0.7, (0.2, 0.2, 0.1, 0.1)))  # ready at 0.2 s and 0.4 s
    assert late.messages == early.messages == 2 and late.comm_s == pytest.approx(early.comm_s) == pytest.approx(1.0)
    assert late.exposed_s == pytest.approx(0.5)  # the second bucket leaves when backward ends
    assert early.exposed_s == pytest.approx(0.0)  # both are through by 1.2 s, well before backward ends at 2 s


def test_ddp_keeps_its_own_buckets_whatever_bucket_mb_says():
    sizes = [0.6 * MB] * 100
    ddp, small = method("ddp", bucket_mb=1.0), method("bucketed", bucket_mb=1.0)
    assert (predict(ddp, sizes, Layout(2, 1), NET).messages
            == predict(method("bucketed"), sizes, Layout(2, 1), NET).messages)
    assert predict(small, sizes, Layout(2, 1), NET).messages > predict(ddp, sizes, Layout(2, 1), NET).messages


def test_a_method_without_a_collective_family_gets_no_prediction():
    class Unmodelled(SyncMethod):
        def sync(self, model):
            pass

    assert predict(Unmodelled(), [1.0], Layout(2, 1), NET) is None


def test_the_layout_of_a_job():
    layout = Layout.of_hosts(["a", "a", "b", "b", "c"])
    assert (layout.world, layout.ranks_per_host, layout.hosts, layout.local) == (5, 2, 3, 2)
    with pytest.raises(ValueError):
        Layout(0, 1)


def test_a_model_average_every_h_steps_costs_one_hth_of_one_and_two_levels_add_the_hosts_own():
    tensors, layout = [4 * MB] * 2, Layout(4, 2)
    flat = predict(method("flat"), tensors, layout, NET)
    every_8 = predict(method("localsgd"), tensors, layout, NET)  # the default period
    assert every_8.comm_s == pytest.approx(flat.comm_s / 8) and every_8.wire_bytes == pytest.approx(8 * MB / 8)
    assert predict(method("diloco", period=1), tensors, layout, NET).comm_s == pytest.approx(flat.comm_s)
    # two levels: the hosts' leaders every 8 steps (hierarchical), each host's own ring of 2 at steps 2, 4, 6
    two = predict(method("localsgd", host_period=2), tensors, layout, NET)
    leaders = predict(method("hierarchical"), tensors, layout, NET).comm_s
    host = 2 * (2 - 1) * 10e-6 + 2 * (2 - 1) / 2 * 8 * MB / 1e9
    assert two.collective == "hierarchical" and two.comm_s == pytest.approx(leaders / 8 + 3 / 8 * host)


def test_an_overlapped_average_is_free_while_it_fits_in_the_period_and_costs_the_rest_when_not():
    tensors, layout = [4 * MB] * 2, Layout(4, 2)
    plain = predict(method("localsgd"), tensors, layout, NET)
    per_step = plain.comm_s  # one average's transfer over its 8 steps
    fits = predict(method("localsgd", overlap=True), tensors, layout, NET, compute_s=2 * per_step)
    assert fits.overlapped and fits.background_s == pytest.approx(per_step) and fits.sync_s == 0.0
    tight = predict(method("localsgd", overlap=True), tensors, layout, NET, compute_s=per_step / 4)
    assert tight.sync_s == pytest.approx(per_step * 3 / 4)  # exposed = transfer - the period's compute, per step
    assert predict(method("localsgd", overlap=True), tensors, layout, NET).sync_s == pytest.approx(per_step)
    # four fragments: a quarter of the model every 2 steps, the same bytes per step
    quarters = predict(method("localsgd", fragments=4), tensors, layout, NET)
    assert quarters.wire_bytes == pytest.approx(plain.wire_bytes)
