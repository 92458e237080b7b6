"""A method's messages priced on a network, by its traits: per tensor, one buffer, buckets behind backward."""

from dataclasses import replace

import pytest
import torch

from mpi_train.config import TrainConfig
from mpi_train.models import build_model
from mpi_train.netmodel import (
    ASSUMED_BACKWARD,
    Backward,
    CollectiveCost,
    JobModel,
    Layout,
    Link,
    Network,
    PlannedMessage,
    message_plan,
    predict,
    tensor_units,
    wire_bytes,
    wire_ratio,
    with_codec,
)
from mpi_train.sync import SYNC_METHODS, SyncMethod, build_method
from mpi_train.sync.fsdp import units
from mpi_train.sync.messages import BUCKETS, ONE_BUFFER, PER_TENSOR, PER_UNIT, message_groups
from mpi_train.sync.traits import Traits

MB = 1e6
NET = Network(intra=Link(alpha=10e-6, beta=1 / 1e9), inter=Link(alpha=100e-6, beta=1 / 125e6))  # 1 GB/s, 1 Gbit/s


def method(name: str, **options) -> SyncMethod:
    return build_method(name, TrainConfig(sync=name, **options))


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


def test_bucketed_sends_a_later_round_only_after_backward():
    # PowerSGD through two 2 MB buckets at ratio 0.1 (0.2 MB each), 0.05 s each on a 4 MB/s link at np 2; 3/4 of the
    # bytes are the Qs. Buckets ready at 1 s and 2 s of a 2 s backward: the Ps leave then (0.0125 s each); the Qs
    # only after backward, one bucket after the other (0.0375 s each), so 0.075 s outlast it
    slow = Network(NET.intra, Link(0.0, 1 / 4e6))
    bucketed = method("bucketed", bucket_mb=2 * MB / 2**20, compression="powersgd")
    plan = message_plan(bucketed, [1 * MB] * 4, Layout(2, 1), slow, ratio=0.1, backward_s=2.0, later=0.75)
    assert [m.tensors for m in plan] == [(3, 2), (1, 0), (3, 2), (1, 0)]
    assert [t for m in plan for t in (m.start_s, m.end_s)] == pytest.approx(
        [1.0, 1.0125, 2.0, 2.0125, 2.0125, 2.05, 2.05, 2.0875])
    assert sum(m.nbytes for m in plan) == pytest.approx(0.4 * MB)
    exposed = predict(bucketed, [1 * MB] * 4, Layout(2, 1), slow, ratio=0.1, backward_s=2.0, later=0.75).exposed_s
    assert exposed == pytest.approx(0.0875)
    # without a later share the whole message leaves with its bucket (0.05 s, a second latency of 0 here)
    whole = predict(bucketed, [1 * MB] * 4, Layout(2, 1), slow, ratio=0.1, backward_s=2.0).exposed_s
    assert whole == pytest.approx(0.05)
    # a schedule that sums after backward anyway is priced as before: the same bytes, the second round's latency
    flat = method("flat", compression="powersgd")
    assert (predict(flat, [4 * MB], Layout(2, 1), NET, ratio=0.1, later=0.75).comm_s
            == pytest.approx(predict(flat, [4 * MB], Layout(2, 1), NET, ratio=0.1).comm_s))


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
    # two levels: the hosts' leaders every 8 steps (two_level), each host's own ring of 2 at steps 2, 4, 6
    two = predict(method("localsgd", host_period=2), tensors, layout, NET)
    leaders = predict(method("hierarchical"), tensors, layout, NET).comm_s
    host = 2 * (2 - 1) * 10e-6 + 2 * (2 - 1) / 2 * 8 * MB / 1e9
    assert two.collective == "two_level" and two.comm_s == pytest.approx(leaders / 8 + 3 / 8 * host)


class ReduceScatterBuckets(SyncMethod):
    """ZeRO-2's schedule as the model sees it: buckets reduce-scattered in backward, parameters gathered after."""

    traits = Traits(family="reduce_scatter", messages=BUCKETS, sends="during backward", bucket_caps=(2 * MB, 2 * MB))


class LayerwiseGathers(ReduceScatterBuckets):
    """FSDP's schedule with one tensor per unit."""

    traits = replace(ReduceScatterBuckets.traits, family="layerwise_gather", bucket_caps=(1 * MB, 1 * MB))


def test_zeros_gathers_hide_behind_the_next_forward_but_the_first_and_a_barrier_waits_for_them_whole():
    # the bucketed case above, each bucket's 0.5 s allreduce now a 0.25 s reduce-scatter in backward and a 0.25 s
    # all-gather started after the step: the last reduce-scatter outlasts backward by 0.25 s; the next forward (1 s,
    # as backward is 2/3) waits for the first layers' bucket's gather (0.25 s) and hides the other
    slow = Network(NET.intra, Link(0.0, 1 / 4e6))
    zero = predict(ReduceScatterBuckets(), [1 * MB] * 4, Layout(2, 1), slow, backward_s=2.0)
    assert zero.parts == pytest.approx({"reduce-scatter": 0.5, "all-gather": 0.5})
    assert zero.comm_s == pytest.approx(1.0) and zero.exposed_s == pytest.approx(0.25 + 0.25)
    assert zero.in_forward_s == pytest.approx(0.25)  # a job counts it in its compute, not its sync
    bucketed = predict(method("bucketed", bucket_mb=2 * MB / 2**20), [1 * MB] * 4, Layout(2, 1), slow,
                       backward_s=2.0)
    assert bucketed.comm_s == pytest.approx(zero.comm_s) and bucketed.parts == {"allreduce": bucketed.comm_s}
    # a job's sync phase leaves out what its next forward waits for (in its compute): the last reduce-scatter's tail
    zero_method = method("zero", bucket_mb=2 * MB / 2**20)
    planned = predict(zero_method, [1 * MB] * 4, Layout(2, 1), slow, backward_s=2.0)
    job = JobModel(zero_method, planned, slow, Layout(2, 1), [1 * MB] * 4)
    assert job.sync_time(3.0) == pytest.approx(0.25)  # backward 2 s of a 3 s compute
    # a barrier after each step (the bench's) waits for both gathers there
    benched = predict(ReduceScatterBuckets(), [1 * MB] * 4, Layout(2, 1), slow, backward_s=2.0,
                      step_ends_at_barrier=True)
    assert benched.exposed_s == pytest.approx(0.25 + 0.5) and benched.comm_s == pytest.approx(zero.comm_s)
    assert benched.in_forward_s == 0
    # a forward of 0.1 s (backward 0.2 s) hides 0.1 s of the gathers' 0.5 s; the reduce-scatters (ready at 0.1 and
    # 0.2 s) end at 0.6 s, 0.4 s past backward
    short = predict(ReduceScatterBuckets(), [1 * MB] * 4, Layout(2, 1), slow, backward_s=0.2)
    assert short.exposed_s == pytest.approx(0.4 + 0.4)
    # float16 halves the reduce-scatter; the all-gather carries the parameters in their own type
    half = predict(method("zero", compression="fp16", bucket_mb=2 * MB / 2**20), [1 * MB] * 4, Layout(2, 1), slow,
                   backward_s=2.0)
    assert half.parts == pytest.approx({"reduce-scatter": 0.25, "all-gather": 0.5})


def test_fsdp_gathers_in_forward_hide_behind_the_forward_but_the_first():
    # 4 tensors of 1 MB at 4 MB/s, np 2: each collective 0.125 s. Backward 2 s (forward 1 s, as backward is 2/3):
    # forward's four gathers (0.5 s) fit in forward but the first unit's (0.125 s); in backward each tensor's gather
    # and reduce-scatter (0.25 s) follow its gradient, the last ready at 2 s: 0.25 s outlast backward
    slow = Network(NET.intra, Link(0.0, 1 / 4e6))
    fsdp = predict(LayerwiseGathers(), [1 * MB] * 4, Layout(2, 1), slow, backward_s=2.0)
    assert fsdp.parts == pytest.approx({"all-gather (forward)": 0.5, "all-gather (backward)": 0.5,
                                        "reduce-scatter": 0.5})
    assert fsdp.comm_s == pytest.approx(1.5) and fsdp.exposed_s == pytest.approx(0.125 + 0.25)
    assert fsdp.in_forward_s == pytest.approx(0.125)
    # without a backward time nothing is known to hide it: the step pays all of it
    assert predict(LayerwiseGathers(), [1 * MB] * 4, Layout(2, 1), slow).sync_s == pytest.approx(1.5)


@pytest.mark.parametrize("name", list(SYNC_METHODS))
def test_every_methods_collectives_add_up_to_its_communication(name):
    prediction = predict(method(name), [1 * MB] * 8, Layout(4, 2), NET, backward_s=0.1)
    assert sum(prediction.parts.values()) == pytest.approx(prediction.comm_s)
    assert prediction.sync_s <= prediction.comm_s + 1e-12


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


def test_fsdp_sends_a_message_per_layer_block_and_each_pays_its_collectives_measured_latency():
    assert message_groups([10, 20, 30, 40], PER_UNIT, units=[0, 0, 1, 1]) == [[3, 2], [1, 0]]  # backward: last first
    assert message_groups([10, 20, 30, 40], PER_UNIT, order=[2, 3, 0, 1], units=[0, 0, 1, 1]) == [[2, 3], [0, 1]]
    assert message_groups([10, 20], PER_UNIT) == [[1], [0]]  # blocks unknown: each tensor its own
    # 4 tensors of 1 MB in 2 blocks, np 2 at 4 MB/s; each collective measured at 10 ms a ring step and 2x a ring's
    # bytes: a block's 2 MB take 10 ms + 2 · 1/2 · 2 MB / 4 MB/s = 0.51 s per collective, three per block
    measured = Network(NET.intra, Link(0.0, 1 / 4e6), collectives=(CollectiveCost("reduce_scatter", 10e-3, 2.0),
                                                                   CollectiveCost("all_gather", 10e-3, 2.0)))
    fsdp = predict(method("fsdp"), [1 * MB] * 4, Layout(2, 1), measured, units=[0, 0, 1, 1])
    assert fsdp.messages == 2 and fsdp.comm_s == pytest.approx(6 * 0.51)
    assert fsdp.parts == pytest.approx({"all-gather (forward)": 1.02, "all-gather (backward)": 1.02,
                                        "reduce-scatter": 1.02})
    # a block per tensor: the same bytes, 2 more blocks' 3 latencies of 10 ms
    apart = predict(method("fsdp"), [1 * MB] * 4, Layout(2, 1), measured, units=[0, 1, 2, 3])
    assert apart.messages == 4 and apart.comm_s - fsdp.comm_s == pytest.approx(2 * 3 * 10e-3)


def test_fsdp_under_a_mixed_precision_gathers_half_the_bytes_and_reduce_scatters_float32():
    tensors, layout = [1 * MB] * 4, Layout(2, 1)
    full = predict(method("fsdp", precision="32-true"), tensors, layout, NET, units=[0, 0, 1, 1])
    for precision in ("bf16-mixed", "16-mixed"):
        mixed = predict(method("fsdp", precision=precision), tensors, layout, NET, units=[0, 0, 1, 1])
        # each all-gather: 2 latencies of 100 us and half of 2 MB in half-size copies on the 1 Gbit/s link
        for gather in ("all-gather (forward)", "all-gather (backward)"):
            assert mixed.parts[gather] == pytest.approx(2 * (100e-6 + 0.5 * 1 * MB / 125e6))
            assert full.parts[gather] == pytest.approx(2 * (100e-6 + 0.5 * 2 * MB / 125e6))
        assert mixed.parts["reduce-scatter"] == pytest.approx(full.parts["reduce-scatter"])
        assert mixed.wire_bytes == full.wire_bytes == 4 * MB  # the gradients' own message
    # `auto` resolves on a device, when the job wraps the model: until then nothing is assumed halved
    assert method("fsdp").traits.gathered_dtype is None
    assert method("zero", precision="bf16-mixed").traits.gathered_dtype is None  # zero keeps float32 parameters


def test_a_model_s_layer_blocks_are_the_units_fsdp_shards():
    with torch.device("meta"):
        vgg = build_model("vgg11")
    # VGG-11: 8 convolutions and 8 BatchNorms in `features`, the head in `classifier`, a weight and a bias each
    assert tensor_units(vgg) == [block for block in range(17) for _ in range(2)]
    assert len(units(vgg)) == 17


def test_a_bucket_s_codec_after_backward_runs_while_another_bucket_s_sum_is_on_the_wire():
    """Two buckets, PowerSGD's Qs sent after backward (1 s): each bucket's Q is computed (20 ms) once its Ps are in
    and sent in turn (50 ms each); its last work (10 ms) waits for its Qs. The second bucket's Q is computed while
    the first's travel: 210 ms after backward, where the wire and then the codec would take 200 + 60."""
    first = [PlannedMessage((0,), 1.0, 0.5, 0.5, 0.6), PlannedMessage((1,), 1.0, 1.0, 1.0, 1.1)]
    later = [PlannedMessage((0,), 0.1, 1.0, 1.1, 1.15, later=True), PlannedMessage((1,), 0.1, 1.0, 1.15, 1.2,
                                                                                   later=True)]
    codec = [0.02, 0.02, 0.01, 0.01]
    assert with_codec(first + later, 1.0, codec) == pytest.approx(0.21)
    slow = [0.2, 0.02, 0.01, 0.01]  # the first Q's work binds, then the two Qs travel in turn, then the last work
    assert with_codec(first + later, 1.0, slow) == pytest.approx(0.2 + 0.05 + 0.05 + 0.01)
    assert with_codec(first, 1.0, [0.03, 0.03]) == pytest.approx(0.13)  # one round: decoded as it lands
    assert with_codec(first + later, 1.0, codec + [0.01]) is None  # a bucket launched after backward
    # the model's own plan marks PowerSGD's later rounds on `bucketed`, the bench places its codec by them
    powersgd = method("bucketed", compression="powersgd", bucket_mb=1 * MB / 2**20)
    plan = predict(powersgd, [1 * MB] * 2, Layout(2, 1), Network(NET.intra, Link(0.0, 1 / 4e6)), backward_s=1.0,
                   later=0.5).plan
    assert [message.later for message in plan] == [False, False, True, True]


def test_a_methods_bytes_on_the_wire_follow_its_compressor_and_its_fragments():
    params = list(build_model("mnist_cnn").parameters())
    whole = sum(p.numel() * p.element_size() for p in params)
    assert wire_bytes(method("flat"), params) == whole and wire_ratio(method("flat"), params) == 1.0
    assert wire_ratio(method("flat", compression="fp16"), params) == 0.5 == wire_ratio(method("ddp_fp16"), params)
    assert wire_bytes(method("localsgd", period=8, fragments=4), params) == whole / 4
