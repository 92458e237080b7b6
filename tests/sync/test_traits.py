"""A sync method in two parts: the frozen traits that say what it is, and a small runtime interface the loop calls."""

import dataclasses

import pytest
import torch

from mpi_train.config import TrainConfig
from mpi_train.netmodel import FAMILIES
from mpi_train.sync import SYNC_METHODS, Synced, SyncMethod, build_method
from mpi_train.sync.bucketed import Bucketed
from mpi_train.sync.compression.fp16 import FP16
from mpi_train.sync.flat import Flat
from mpi_train.sync.localsgd import LocalSGD
from mpi_train.sync.traits import TRAIT_NAMES, TWO_LEVEL, Cadence, Traits

# what the training loop, the bench and checkpoints call on a method; everything else it is, is in its traits
RUNTIME = {"compressor", "record_into", "wrap", "make_optimizer", "accumulating", "sync", "after_step", "finish",
           "evaluated", "explaining", "save", "load", "tensors"}


def public_members(method: SyncMethod) -> set[str]:
    """The public names a method object answers to: its class's methods and attributes, and its own attributes."""
    return {name for name in {*dir(type(method)), *vars(method)} if not name.startswith("_")} - {"traits"}


def test_the_runtime_interface_is_what_the_loop_calls_and_no_trait_hides_in_it():
    members = public_members(SyncMethod())
    assert members == RUNTIME and len(members) <= 13
    assert not members & TRAIT_NAMES


def test_every_registered_method_declares_its_traits_and_names_a_known_family():
    for name, method_class in SYNC_METHODS.items():
        traits = method_class.traits
        assert isinstance(traits, Traits), name
        assert traits.family in FAMILIES, name
        assert set(traits.compressions) >= {"none"} or traits.fixed_compression, name
        # a trait set as a plain class attribute anywhere in its classes would be read by nobody
        assert not any(TRAIT_NAMES & set(vars(cls)) for cls in method_class.__mro__ if cls is not object), name


def test_a_trait_set_as_a_class_attribute_is_refused_with_where_to_declare_it():
    with pytest.raises(TypeError, match="Stray sets messages, shards as class attributes.*traits"):
        type("Stray", (SyncMethod,), {"shards": "optimizer state", "messages": "buckets"})


def test_traits_are_frozen_and_a_subclass_builds_on_its_parents():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Flat.traits.family = "root"
    assert SYNC_METHODS["flat_fp16"].traits == dataclasses.replace(Flat.traits, fixed_compression="fp16",
                                                                    wire_dtype=torch.float16)
    assert SYNC_METHODS["zero"].traits.tunables == Bucketed.traits.tunables == ("bucket_mb",)


def test_a_configured_method_carries_what_its_options_set():
    assert Bucketed(bucket_mb=0.5).traits.bucket_caps == (0.5 * 2**20, 0.5 * 2**20)
    assert Bucketed(bucket_mb=4.0).traits.bucket_caps == (2**20, 4 * 2**20)
    assert Flat(FP16()).traits.wire_dtype == torch.float16 and Flat.traits.wire_dtype is None
    averaging = LocalSGD(period=8, fragments=2, host_period=2, overlap=True, compressor=FP16())
    assert averaging.traits.cadence == Cadence(period=8, fragments=2, host_period=2, overlap=True)
    assert averaging.traits.cadence.every == 4  # steps between two fragments' averages
    assert averaging.traits.family == TWO_LEVEL and LocalSGD.traits.family == "ring_allreduce"
    assert LocalSGD.traits.cadence is None  # the class says what it is; only a configured one has a cadence


def test_a_trait_is_read_from_traits_not_off_the_method():
    method = build_method("flat", TrainConfig(sync="flat", compression="bf16"))
    assert method.traits.wire_dtype is torch.bfloat16
    assert SYNC_METHODS["ddp"].traits.overlapped()
    assert SYNC_METHODS["ddp_fp16"].traits.compression_name("none") == "fp16"
    with pytest.raises(AttributeError):
        method.wire_dtype  # noqa: B018
    with pytest.raises(AttributeError):
        SYNC_METHODS["zero"].shards  # noqa: B018


def test_after_step_says_what_the_step_synchronised():
    """A gradient method syncs every rank at every step; a model-averaging one says when it averaged, and where."""
    assert SyncMethod().after_step(torch.nn.Linear(1, 1)) == Synced(scope="all", averaged=False)
    method = LocalSGD(period=2, local_start_step=1)
    model = torch.nn.Linear(2, 1)
    method.wrap(model)
    method.make_optimizer(model, lambda params: torch.optim.SGD(params, lr=0.1))
    assert method.after_step(model).scope == "gradients"  # step 1: the warm-up's plain gradient average
