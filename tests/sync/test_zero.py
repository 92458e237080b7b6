"""zero's shard arithmetic (padding, world sizes that do not divide), its checkpoint layout and its timeline messages;
fsdp's units."""

import itertools
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import forked_ranks

from mpi_train.lr_schedule import OptimizerDefaults
from mpi_train.models import INPUT_SHAPES, build_model
from mpi_train.optimizers import AdamW
from mpi_train.sync import WHOLE_VIEW
from mpi_train.sync.flat import padded_length
from mpi_train.sync.fsdp import units
from mpi_train.sync.zero import Zero, shard_bounds
from mpi_train.timeline import Alignment, StepRecorder, now


@pytest.mark.parametrize("count", [1, 7, 784, 785, 786])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_the_shards_tile_the_padded_bucket_equally_and_pad_by_less_than_one_number_per_rank(count, world):
    bounds = [shard_bounds(count, world, rank) for rank in range(world)]
    assert bounds[0][0] == 0 and all(end == start for (_, end), (start, _) in itertools.pairwise(bounds))
    assert len({end - start for start, end in bounds}) == 1  # equal: what reduce_scatter_single cuts
    padded = bounds[-1][1]
    assert padded == padded_length(count, world) and padded % world == 0 and 0 <= padded - count < world


def test_785_numbers_on_3_ranks_pad_to_786():
    assert [shard_bounds(785, 3, rank) for rank in range(3)] == [(0, 262), (262, 524), (524, 786)]



def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)


def adamw(params):
    return AdamW.build(params, OptimizerDefaults("adamw", lr=0.01, momentum=None, weight_decay=0.1, warmup_steps=0))


def three_steps(model, method=None, recorder=None, build=sgd):
    net = method.wrap(model) if method else model
    optimizer = method.make_optimizer(model, build) if method else build(model.parameters())
    if recorder:
        method.record_into(recorder)
    torch.manual_seed(1)
    images, labels = torch.randn(4, *INPUT_SHAPES["mnist_cnn"]), torch.randint(0, 10, (4,))
    for step in range(1, 4):
        if recorder:
            recorder.begin(step)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(net(images), labels).backward()
        if method:
            method.sync(model)
        optimizer.step()
        if method:
            method.after_step(model)
    return optimizer


@pytest.mark.parametrize("build", [sgd, adamw], ids=["sgd", "adamw"])
def test_zero_steps_as_the_optimizer_does_and_gives_its_state_in_its_layout(one_rank_group, build):
    torch.manual_seed(0)
    reference, model = build_model("mnist_cnn", dropout=0.0), build_model("mnist_cnn", dropout=0.0)
    model.load_state_dict(reference.state_dict())
    plain = three_steps(reference, build=build)
    method, recorder = Zero(bucket_mb=0.01), StepRecorder(Alignment(), overlapped=True, window=(3, 3))
    optimizer = three_steps(model, method, recorder, build=build)
    assert len(method.buckets) > 2 and len(optimizer.param_groups[0]["params"]) == len(method.buckets)
    # the last step's all-gathers are still in flight, for the next forward to take in
    assert sorted(method.gathering) == list(range(len(method.buckets)))
    time.sleep(0.2)  # (one rank's all-gathers finish at once)
    waited_from = now()
    whole = method.tensors(model, WHOLE_VIEW)  # waits for them
    assert not method.gathering
    # the timeline's messages: each bucket's reduce-scatter, then the all-gathers in forward order (the first
    # layers' bucket, the last, first), each of the bucket's bytes
    noted = [(m.name, m.bucket, m.nbytes) for m in recorder.current.messages if m.kind == "message"]
    sizes = [sum(p.numel() * 4 for p in bucket.params) for bucket in method.buckets]
    assert noted == ([("reduce-scatter", b, size) for b, size in enumerate(sizes)]
                     + [("all-gather", b, size) for b, size in reversed(list(enumerate(sizes)))])
    assert all(m.end is not None and m.end >= m.start for m in recorder.current.messages)
    # an all-gather ends when the backend has it done, not when a forward (here the wait above) comes to want it
    assert all(m.end < waited_from for m in recorder.current.messages if m.name == "all-gather")
    for ours, theirs in zip(whole, reference.parameters()):
        assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        assert ours.grad is None  # the full gradient is not kept between steps
    whole, expected = method.save(model, optimizer)["optimizer"], plain.state_dict()
    assert sorted(whole["state"]) == sorted(expected["state"])
    for index, entry in expected["state"].items():
        # SGD's momentum buffer; AdamW's two moments and its step count (3.0 for every parameter)
        assert sorted(whole["state"][index]) == sorted(entry)
        for key, value in entry.items():
            assert torch.allclose(whole["state"][index][key], value, rtol=1e-5, atol=1e-6), key
    assert whole["param_groups"][0]["params"] == expected["param_groups"][0]["params"]
    assert whole["param_groups"][0]["lr"] == plain.param_groups[0]["lr"]
    # taken back into a fresh method's shard: the same state, bit for bit
    again = Zero(bucket_mb=0.01)
    again.wrap(model)
    fresh = again.make_optimizer(model, build)
    again.load(model, fresh, {"optimizer": whole})
    held = optimizer.state_dict()["state"]
    for number, shard in enumerate(again.shard_params):
        assert sorted(fresh.state[shard]) == sorted(held[number])
        for key, value in held[number].items():
            assert torch.equal(fresh.state[shard][key], value), key
    # a checkpoint's weights reach the slices the optimizer steps, not only the model
    weights = {key: value + 1 for key, value in reference.state_dict().items()}
    again.load(model, fresh, {"model": weights})
    assert torch.equal(again.shard_params[0][:1], weights[[n for n, _ in model.named_parameters()][-1]].reshape(-1)[:1])


@pytest.mark.parametrize(("name", "expected"), [
    ("vgg11", 8 + 8 + 1),  # its 8 convolutions, 8 BatchNorms and the Linear head, the model being one Sequential
    ("mnist_cnn", 4),
])
def test_fsdp_shards_each_layer_of_the_models_stacks(name, expected):
    found = units(build_model(name))
    assert len(found) == expected or pytest.fail(f"{[type(u).__name__ for u in found]}")


def test_fsdp_leaves_gpts_tied_embedding_and_head_with_the_root_and_shards_each_block():
    model = build_model("gpt")
    found = units(model)
    assert found == list(model.blocks)


def test_fsdp_reshards_the_roots_parameters_after_an_evaluation(one_rank_group):
    """FSDP2 leaves the root's parameters gathered after a forward (for the backward that usually follows); after a
    test evaluation they must be shards again, or reading the model (replicas' check, memory, checkpoints) breaks."""
    from torch.distributed.tensor import DTensor

    from mpi_train.models.gpt import GptShape, gpt
    from mpi_train.sync.fsdp import FSDP

    model = gpt(GptShape(layers=1, heads=1, width=16, context=8))
    method = FSDP()
    method.wrap(model)
    with method.evaluated(model), torch.no_grad():
        model(torch.zeros(2, 8, dtype=torch.long))
        assert not isinstance(model.token_embedding.weight, DTensor)  # gathered by the forward: what needs undoing
    assert all(isinstance(param, DTensor) for param in model.parameters())
    assert [tuple(p.shape) for p in method.tensors(model, WHOLE_VIEW)] == [tuple(p.shape) for p in model.parameters()]


def ring_messages(rank: int, store: str, queue) -> None:
    """One step of zero on Gloo (its ring's thread), the sync called a second after both ranks' backward: its
    reduce-scatters' timeline messages and the times backward ended and the sync began."""
    try:
        torch.set_num_threads(1)  # the parent's OpenMP pool does not survive the fork
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        torch.manual_seed(0)
        model, method = build_model("mnist_cnn", dropout=0.0), Zero(bucket_mb=0.01)
        recorder = StepRecorder(Alignment(), overlapped=True, window=(1, 1))
        net = method.wrap(model)
        method.make_optimizer(model, sgd)
        method.record_into(recorder)
        recorder.begin(1)
        F.cross_entropy(net(torch.randn(4, *INPUT_SHAPES["mnist_cnn"])), torch.tensor([0, 1, 2, 3])).backward()
        dist.barrier()  # both ranks' buckets launched (the ring runs on a group of its own)
        backward_end = now()
        time.sleep(1.0)
        synced = now()
        method.sync(model)
        messages = [(m.name, m.start, m.end) for m in recorder.current.messages if m.name == "reduce-scatter"]
        queue.put((rank, (messages, backward_end, synced)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it
        queue.put((rank, traceback.format_exc()))


def test_on_gloo_each_reduce_scatter_ends_where_the_rings_thread_finished_it_not_where_it_was_waited_for(tmp_path):
    for messages, backward_end, synced in forked_ranks(ring_messages, 2, str(tmp_path / "store")).values():
        assert len(messages) > 2
        # the last bucket left as backward ended and its kilobytes took milliseconds, long before the sync waited
        assert all(start <= end < synced - 0.5 for _, start, end in messages), (messages, backward_end, synced)
