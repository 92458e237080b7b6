"""Between the sync and the optimizer step: every rank skips a step whose gradients overflow on any one of them, the
norm is the shards' together where the optimizer steps shards and each rank's own under model averaging, fsdp's
DTensor gradients are unscaled and clipped in place, the forced overflow lands where it says, and the one
combination 16-mixed cannot run is refused."""

import traceback

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import forked_ranks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.failpoints import OVERFLOW_ENV, NoOverflow, Overflow, overflowing
from mpi_train.models import INPUT_SHAPES, build_model
from mpi_train.step.gradients import OptimizerGradients, optimizer_gradients
from mpi_train.step.precision import PRECISIONS
from mpi_train.sync import SYNC_METHODS

CPU = torch.device("cpu")
SCALE = 2.0**16  # the scaler's first


def two_steps(rank: int, store: str, queue) -> None:
    """Per method kind, two steps of gradients [3, 4] x (rank + 1), scaled: in the first, rank 1's holds an inf;
    what each rank's OptimizerGradients decided, its scale and skipped steps, the norm and the clipped gradient."""
    try:
        torch.set_num_threads(1)  # the parent's OpenMP pool does not survive the fork
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        found = {}
        for name in ("zero", "fsdp", "localsgd", "allreduce"):
            param = torch.zeros(2, requires_grad=True)
            optimizer = torch.optim.SGD([param], lr=0.1)
            gradients = OptimizerGradients(PRECISIONS["16-mixed"], SYNC_METHODS[name], optimizer, 1.0, CPU, 2)
            param.grad = torch.tensor([3.0, float("inf") if rank == 1 else 4.0]) * SCALE
            first = (gradients.ready(), gradients.figures())
            param.grad = torch.tensor([3.0, 4.0]) * (rank + 1) * SCALE / 2  # at the halved scale
            second = (gradients.ready(), gradients.figures(), param.grad.tolist())
            found[name] = (first, second)
        queue.put((rank, found))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it
        queue.put((rank, traceback.format_exc()))


def test_an_overflow_on_one_rank_skips_the_step_on_both_and_the_norm_is_the_one_the_optimizer_applies(tmp_path):
    ranks = forked_ranks(two_steps, 2, str(tmp_path / "store"))
    for rank, found in ranks.items():
        for name, (first, second) in found.items():
            assert first == (False, {"grad_scale": SCALE / 2, "skipped_steps": 1}), (name, rank)
            ready, figures, clipped = second
            own = 5.0 * (rank + 1)
            # zero and fsdp step shards: the norm is both ranks' together; model averaging and a replicated method
            # take their own (a replicated method's ranks hold the same gradient, which this test does not)
            norm = (25.0 + 100.0) ** 0.5 if name in ("zero", "fsdp") else own
            assert ready and figures == {"grad_norm": pytest.approx(norm, rel=1e-12), "grad_scale": SCALE / 2,
                                         "skipped_steps": 1}, (name, rank)
            assert clipped == pytest.approx([3.0 * (rank + 1) / (norm + 1e-6), 4.0 * (rank + 1) / (norm + 1e-6)],
                                            rel=1e-6), (name, rank)


def test_fsdps_dtensor_gradients_are_unscaled_and_clipped_in_place(one_rank_group):
    torch.manual_seed(0)
    plain = build_model("mnist_cnn", dropout=0.0)
    sharded = build_model("mnist_cnn", dropout=0.0)
    sharded.load_state_dict(plain.state_dict())
    fully_shard(sharded, mesh=init_device_mesh("cpu", (1,)))  # on a CPU also where a GPU is there
    images, labels = torch.randn(4, *INPUT_SHAPES["mnist_cnn"]), torch.tensor([0, 1, 2, 3])
    F.cross_entropy(plain(images), labels).backward()
    expected = torch.cat([p.grad.double().reshape(-1) for p in plain.parameters()]).norm().item()
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.1)
    gradients = OptimizerGradients(PRECISIONS["16-mixed"], SYNC_METHODS["fsdp"], optimizer, 0.01, CPU, 1)
    gradients.scaled(F.cross_entropy(sharded(images), labels)).backward()
    assert all(type(p.grad).__name__ == "DTensor" for p in sharded.parameters())
    assert gradients.ready()
    assert gradients.figures()["grad_norm"] == pytest.approx(expected, rel=1e-6)
    for ours, theirs in zip(optimizer_gradients(optimizer), (p.grad for p in plain.parameters())):
        torch.testing.assert_close(ours, theirs * (0.01 / (expected + 1e-6)), rtol=1e-5, atol=1e-12)


def test_the_forced_overflow_puts_inf_in_one_output_channel_of_the_first_layer_on_its_rank_and_step():
    torch.manual_seed(0)
    model = build_model("mnist_cnn", dropout=0.0)
    overflow = Overflow(rank=1, step=2).watch(model)
    images, labels = torch.randn(4, *INPUT_SHAPES["mnist_cnn"]), torch.tensor([0, 1, 2, 3])
    for rank, step in ((0, 2), (1, 1), (1, 2)):
        model.zero_grad(set_to_none=True)
        overflow.at(rank, step)
        F.cross_entropy(model(images), labels).backward()
        finite = [bool(p.grad.isfinite().all()) for p in model.parameters()]
        if (rank, step) != (1, 2):
            assert all(finite)
            continue
        first = next(model.parameters())  # the first convolution's kernel: channel 0 alone overflowed
        assert not first.grad[0].isfinite().any() and first.grad[1:].isfinite().all()
        assert finite[2:] == [True] * (len(finite) - 2)  # the layers after it, and its bias but channel 0's
        assert not finite[1]
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(images), labels).backward()  # armed once: the next step is clean
    assert all(p.grad.isfinite().all() for p in model.parameters())


def test_the_forced_overflow_touches_only_a_job_with_a_loss_scale_and_a_bad_value_is_refused(monkeypatch):
    model = build_model("mnist_cnn", dropout=0.0)
    monkeypatch.setenv(OVERFLOW_ENV, "1:2")
    assert isinstance(overflowing(model, scaled=False), NoOverflow)
    assert isinstance(overflowing(model, scaled=True), Overflow)
    monkeypatch.setenv(OVERFLOW_ENV, "1:0")
    with pytest.raises(UserError, match=r"\$MPI_TRAIN_OVERFLOW_AT='1:0' is not RANK:STEP with a rank of the job and a "
                                        r"step from 1 .*; unset it for a normal run\."):
        overflowing(model, scaled=True)


@pytest.mark.parametrize("sync, compression", [("bucketed", "powersgd"), ("allreduce", "powersgd"),
                                               ("ddp_powersgd", "none")])
def test_16_mixed_refuses_powersgd_on_gradients_whose_error_feedback_would_keep_an_overflow(sync, compression):
    with pytest.raises(UserError, match=rf"--precision 16-mixed scales the loss, so the gradients that --sync {sync} "
                                        r"compresses with PowerSGD carry the scale.*Use --precision bf16-mixed"):
        TrainConfig(precision="16-mixed", sync=sync, compression=compression).validate(world_size=2)


@pytest.mark.parametrize("precision, sync, compression", [("bf16-mixed", "bucketed", "powersgd"),
                                                          ("16-mixed", "localsgd", "powersgd"),
                                                          ("16-mixed", "bucketed", "fp16")])
def test_every_other_combination_of_precision_and_compression_runs(precision, sync, compression):
    TrainConfig(precision=precision, sync=sync, compression=compression).validate(world_size=2)
