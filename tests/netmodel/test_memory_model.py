"""Memory per rank as the model predicts it, from what a method shards, against hand computations."""

import pytest
import torch
from torch import nn

from mpi_train.config import TrainConfig
from mpi_train.memory import held_bytes
from mpi_train.netmodel.memory import largest_unit_bytes, predict_memory, shard_bytes
from mpi_train.sync import SYNC_METHODS, SyncMethod, build_method
from mpi_train.sync.base import EVERYTHING, GRADIENTS_AND_STATE, OPTIMIZER_STATE, REPLICATED
from mpi_train.sync.messages import BUCKETS
from mpi_train.sync.traits import Traits


def small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 3))  # 55 and 18 floats: 73, 292 bytes


def sharding(what: str, messages: str = "one buffer") -> SyncMethod:
    return type("Sharding", (SyncMethod,), {"traits": Traits(shards=what, messages=messages)})()


def test_replicated_holds_everything_and_momentum_doubles_the_state():
    assert predict_memory(sharding(REPLICATED), small(), 4, state_slots=1).as_dict() == {
        "parameters_bytes": 292, "gradients_bytes": 292, "optimizer_bytes": 292, "gathered_bytes": 0,
        "total_bytes": 876}
    assert predict_memory(sharding(REPLICATED), small(), 4, state_slots=0).optimizer == 0


def test_each_zero_stage_divides_its_part_by_n_with_the_last_shard_padded():
    # 73 elements on 3 ranks: ceil(73/3) = 25 elements = 100 bytes each
    stage1 = predict_memory(sharding(OPTIMIZER_STATE), small(), 3, state_slots=1)
    assert (stage1.parameters, stage1.gradients, stage1.optimizer) == (292, 292, 100)
    stage2 = predict_memory(sharding(GRADIENTS_AND_STATE), small(), 3, state_slots=1)
    assert (stage2.parameters, stage2.gradients, stage2.optimizer, stage2.gathered) == (292, 100, 100, 0)
    # ZeRO-3 shards each tensor by rows, padded (5x10 -> 2 rows of 10, 5 -> 2, 3x5 -> 1 row of 5, 3 -> 1: 28
    # elements, 112 bytes) and gathers one unit at a time: the largest, the first Linear's 55 floats
    stage3 = predict_memory(sharding(EVERYTHING), small(), 3, state_slots=1)
    assert (stage3.parameters, stage3.gradients, stage3.optimizer, stage3.gathered) == (112, 112, 112, 220)
    assert stage3.total == 3 * 112 + 220
    assert predict_memory(sharding(EVERYTHING), small(), 1, state_slots=1).total == 876  # one rank: nothing to shard
    # fsdp under a mixed precision gathers each unit as half-size copies; its shards stay float32
    mixed = predict_memory(build_method("fsdp", TrainConfig(sync="fsdp", precision="bf16-mixed")), small(), 3, 1)
    assert (mixed.parameters, mixed.gradients, mixed.optimizer, mixed.gathered) == (112, 112, 112, 110)


def test_zero2_buckets_pad_each_shard_by_less_than_n_elements():
    # 1 MB first bucket, then 25 MB: a model of 3 tensors of 0.75 MB (196,608 floats) -> buckets [[2, 1], [0]]
    model = nn.Sequential(*[nn.Linear(512, 384, bias=False) for _ in range(3)])
    stage2 = predict_memory(sharding(GRADIENTS_AND_STATE, BUCKETS), model, 7, state_slots=1)
    expected = (-(-2 * 196608 // 7) - (-196608 // 7)) * 4  # ceil per bucket
    assert stage2.gradients == expected and 0 < expected - 3 * 196608 * 4 / 7 < 2 * 7 * 4


def test_largest_unit_is_the_largest_modules_own_parameters():
    assert largest_unit_bytes(small()) == 55 * 4
    assert shard_bytes([10, 3], 4, 4) == (3 + 1) * 4


@pytest.mark.parametrize("name", list(SYNC_METHODS))
def test_every_method_is_predicted_by_what_it_shards(name):
    method = build_method(name, TrainConfig(sync=name))
    whole = predict_memory(sharding(REPLICATED), small(), 4, state_slots=1)
    predicted = predict_memory(method, small(), 4, state_slots=1)
    sharded = {REPLICATED: set(), OPTIMIZER_STATE: {"optimizer"}, GRADIENTS_AND_STATE: {"gradients", "optimizer"},
               EVERYTHING: {"parameters", "gradients", "optimizer"}}[method.traits.shards]
    for kind in ("parameters", "gradients", "optimizer"):
        mine, full = getattr(predicted, kind), getattr(whole, kind)
        if kind == "parameters" and method.traits.keeps_parameter_shard:  # whole, plus its own shard
            assert full + full / 4 <= mine <= full + full / 4 + 17 * 4, kind
            continue
        assert (mine < full) if kind in sharded else (mine == full), kind
        if kind in sharded:  # a quarter, padded by at most a row of each tensor (10 + 1 + 5 + 1 floats)
            assert full / 4 <= mine <= full / 4 + 17 * 4


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_the_prediction_of_a_replicated_method_is_what_a_rank_measures(momentum):
    model = small()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
    predicted = predict_memory(SYNC_METHODS["allreduce"](), model, 2, 1 if momentum else 0).as_dict()
    measured = held_bytes(model, optimizer)
    assert {key: predicted[key] for key in measured} == measured
