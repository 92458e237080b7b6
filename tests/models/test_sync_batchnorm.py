"""--sync-bn: two ranks' GlobalBatchNorm computes what one process's BatchNorm does on the whole batch (forward,
gradients, running statistics); the layers keep their state; the flag is refused where it cannot mean anything."""

import copy
import traceback

import pytest
import torch
import torch.distributed as dist
from conftest import forked_ranks
from torch import nn

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.models import build_model
from mpi_train.models.sync_batchnorm import GlobalBatchNorm, globalise_batchnorm

BATCH = 12  # split 8 + 4: the ranks' shares need not be equal


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 5, 3), nn.BatchNorm2d(5))


def batch() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(BATCH, 3, 7, 7) * 3 + 5  # a mean well away from 0: where E[x^2] - E[x]^2 loses digits


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum() / BATCH  # each sample its own weights


def one_rank(rank: int, store: str, queue) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        net = small_net()
        assert globalise_batchnorm(net) == 2
        share = slice(0, 8) if rank == 0 else slice(8, BATCH)
        out = net(batch()[share])
        # the loss of the whole batch is the sum of the ranks' parts (weights by position in the whole batch)
        whole_weights = torch.linspace(-1, 1, BATCH * out[0].numel()).view(BATCH, *out.shape[1:])
        ((out * whole_weights[share]).sum() / BATCH).backward()
        grads = [p.grad.clone() for p in net.parameters()]
        for grad in grads:
            dist.all_reduce(grad)  # what a gradient sync adds up
        bn = net[4]
        queue.put((rank, (out.detach(), grads, bn.running_mean.clone(), bn.running_var.clone())))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it
        queue.put((rank, traceback.format_exc()))


def test_two_ranks_normalise_train_and_track_as_one_process_on_the_whole_batch(tmp_path):
    got = forked_ranks(one_rank, 2, str(tmp_path / "store"))
    net = small_net()
    out = net(batch())
    loss_of(out).backward()
    gathered = torch.cat([got[0][0], got[1][0]])
    assert torch.allclose(gathered, out.detach(), rtol=1e-5, atol=1e-5)
    for rank in (0, 1):
        _, grads, running_mean, running_var = got[rank]
        for mine, theirs in zip(grads, [p.grad for p in net.parameters()]):
            assert torch.allclose(mine, theirs, rtol=1e-4, atol=1e-6)
        assert torch.allclose(running_mean, net[4].running_mean, rtol=1e-5)
        assert torch.allclose(running_var, net[4].running_var, rtol=1e-5)
    # a plain BatchNorm on each share would not: the test can fail
    halves = torch.cat([small_net()(batch()[:8]), small_net()(batch()[8:])])
    assert not torch.allclose(halves, out, rtol=1e-3, atol=1e-3)


def test_globalised_layers_keep_their_state_and_run_as_batchnorm_on_one_process():
    plain = small_net()
    turned = copy.deepcopy(plain)
    globalise_batchnorm(turned)
    assert isinstance(turned[1], GlobalBatchNorm) and isinstance(turned[1], nn.modules.batchnorm._BatchNorm)
    assert plain.state_dict().keys() == turned.state_dict().keys()
    assert torch.equal(plain(batch()), turned(batch()))  # no process group: BatchNorm's own forward
    plain.eval(), turned.eval()
    assert torch.equal(plain(batch()), turned(batch()))


def test_sync_bn_is_refused_without_batchnorm_and_with_model_averaging():
    with pytest.raises(UserError, match="--model mnist_cnn has none. Drop --sync-bn"):
        TrainConfig(model="mnist_cnn", dataset="synthetic", sync_bn=True).validate(world_size=2)
    with pytest.raises(UserError, match="--sync localsgd lets each rank train on its own"):
        TrainConfig(model="vgg11", dataset="synthetic", sync="localsgd", sync_bn=True).validate(world_size=2)
    TrainConfig(model="vgg11", dataset="synthetic", sync="fsdp", sync_bn=True).validate(world_size=2)
    TrainConfig(model="resnet18", dataset="synthetic", sync_bn=True).validate(world_size=2)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in build_model("vgg11").modules()) == 8
