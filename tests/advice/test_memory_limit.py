"""--memory-limit: sizes as people write them, and the candidates the model predicts fit in them."""

import pytest
import torch
from torch import nn

from mpi_train.advice import memory_limit
from mpi_train.advice.search import Candidate
from mpi_train.commands import advise
from mpi_train.errors import UserError
from mpi_train.netmodel.memory import predict_memory
from mpi_train.sync import SYNC_METHODS
from mpi_train.sync.base import REPLICATED


@pytest.mark.parametrize("text, expected", [("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20), ("1.5 KiB", 1536),
                                            ("4096", 4096), ("100B", 100), ("3gib", 3 * 2**30)])
def test_sizes_take_binary_units(text, expected):
    assert memory_limit.parse_size(text) == expected


@pytest.mark.parametrize("text", ["2GB", "lots", "-1GiB", "0MiB", "GiB", ""])
def test_a_bad_size_is_one_paragraph_with_the_units_to_use(text):
    with pytest.raises(UserError, match=r"--memory-limit .* is not a size: .* B, KiB, MiB, GiB or TiB, e\.g\. "
                                        r"--memory-limit 2GiB"):
        memory_limit.parse_size(text)


def test_the_advisor_refuses_a_bad_limit_before_anything_else():
    args = advise.build_parser().parse_args(["--memory-limit", "2 gigs"])
    with pytest.raises(UserError, match="--memory-limit '2 gigs' is not a size"):
        advise.validate(args, world=1)  # (one rank is refused too, after the flags)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def test_candidates_over_the_limit_are_left_out_with_why():
    held = {"ddp": 3 * 2**20, "zero": 1.5 * 2**20}
    kept, left_out = memory_limit.within([Candidate("ddp"), Candidate("zero")], held, 2 * 2**20)
    assert kept == [Candidate("zero")]
    assert left_out == [("ddp", "predicted to hold 3.00 MiB per rank, over --memory-limit 2.00 MiB")]
    assert memory_limit.within([Candidate("ddp")], held, None) == ([Candidate("ddp")], [])
    error = memory_limit.none_fit(held, 2**20, 4)
    assert "no sync method fits --memory-limit 1.00 MiB per rank on 4 ranks: the least, zero, is predicted to hold " \
           "1.50 MiB" in str(error)


def test_a_limit_below_a_replica_leaves_only_the_methods_that_shard():
    names = [name for name in SYNC_METHODS if SYNC_METHODS[name].traits.averages == "gradients"]
    methods = {name: Candidate(name).method() for name in names}
    held = memory_limit.held_per_rank(methods, model(), 4, state_slots=1)
    replica = predict_memory(SYNC_METHODS["ddp"](), model(), 4, state_slots=1).total
    assert held["ddp"] == replica == 3 * (256 * 256 + 256 + 2560 + 10) * 4
    kept, left_out = memory_limit.within([Candidate(name) for name in names], held, int(replica) - 1)
    assert {c.sync for c in kept} == {name for name in names if methods[name].traits.shards != REPLICATED}
    assert {label for label, _ in left_out} == {name for name in names if methods[name].traits.shards == REPLICATED}


def test_the_advisor_keeps_what_fits_and_stops_when_nothing_does():
    found = [Candidate("ddp"), Candidate("bucketed", 25.0), Candidate("flat")]
    replica = 3 * (256 * 256 + 256 + 2560 + 10) * 4
    kept, left_out, held = memory_limit.fitting(found, model(), 2, 1, replica)
    assert kept == found and left_out == [] and set(held.values()) == {replica}
    assert memory_limit.fitting(found, model(), 2, 0, 2 * replica // 3)[0] == found  # no momentum: P + G
    with pytest.raises(UserError, match=r"no sync method fits --memory-limit 801.12 KiB per rank on 2 ranks: the "
                                        r"least, ddp, is predicted to hold 801.12 KiB per rank"):
        memory_limit.fitting(found, model(), 2, 1, replica - 1)
