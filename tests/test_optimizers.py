"""--optimizer: each model's defaults per optimizer, SGD-only flags refused with AdamW, AdamW's state where the
methods reach it (memory per rank measured and predicted, zero_torch's wrapper, local SGD's --local-momentum on a
real 2-rank Gloo group)."""

import traceback

import pytest
import torch
import torch.distributed as dist
from conftest import forked_ranks
from torch import nn

from mpi_train.commands.train import parse_config
from mpi_train.errors import UserError
from mpi_train.lr_schedule import GENERAL, MODEL_DEFAULTS
from mpi_train.memory import held_bytes
from mpi_train.netmodel.memory import predict_memory
from mpi_train.optimizers import ADAMW_BETAS, OPTIMIZERS, state_slots
from mpi_train.sync.allreduce import AllReduce
from mpi_train.sync.localsgd import LocalSGD
from mpi_train.sync.zero_torch import ZeroTorch


def test_gpt_steps_with_adamw_and_the_image_models_keep_sgd():
    gpt = parse_config(["--dataset", "text"]).optimizer_settings
    assert (gpt.optimizer, gpt.lr, gpt.momentum, gpt.weight_decay) == ("adamw", 3e-3, None, 0.0)
    assert parse_config(["--dataset", "cifar10"]).optimizer_settings == MODEL_DEFAULTS["vgg11"][0]
    assert parse_config(["--dataset", "mnist"]).optimizer_settings.optimizer == "sgd"
    # gpt with SGD takes SGD's measured setting, not AdamW's rate
    assert parse_config(["--dataset", "text", "--optimizer", "sgd"]).optimizer_settings == MODEL_DEFAULTS["gpt"][1]
    # a model with no measured AdamW setting: the general one, with the warm-up of the model's own optimizer
    vgg = parse_config(["--dataset", "cifar10", "--optimizer", "adamw", "--lr", "5e-4"])
    settings = vgg.optimizer_settings
    assert (settings.optimizer, settings.lr, settings.weight_decay) == ("adamw", 5e-4, GENERAL["adamw"].weight_decay)
    assert settings.warmup_steps == MODEL_DEFAULTS["vgg11"][0].warmup_steps
    assert vgg.as_dict()["optimizer"] == "adamw" and vgg.as_dict()["lr"] == 5e-4  # what MLflow's params get


def test_each_name_builds_its_torch_optimizer_with_the_jobs_settings():
    param = nn.Parameter(torch.zeros(3))
    adamw = OPTIMIZERS["adamw"].build([param], parse_config(["--dataset", "text", "--weight-decay", "0.1"])
                                      .optimizer_settings)
    assert isinstance(adamw, torch.optim.AdamW)
    assert (adamw.defaults["lr"], adamw.defaults["betas"], adamw.defaults["weight_decay"]) == (3e-3, ADAMW_BETAS, 0.1)
    sgd = OPTIMIZERS["sgd"].build([param], parse_config(["--dataset", "mnist"]).optimizer_settings)
    assert type(sgd) is torch.optim.SGD and sgd.defaults["momentum"] == 0.9


def test_momentum_is_refused_with_adamw_and_an_unknown_optimizer_by_the_parser():
    with pytest.raises(UserError, match=r"--momentum 0.8 is SGD's .* adamw .*--optimizer sgd"):
        parse_config(["--dataset", "text", "--momentum", "0.8"]).validate(1)
    with pytest.raises(UserError, match="--optimizer adamw"):
        parse_config(["--dataset", "cifar10", "--optimizer", "adamw", "--momentum", "0.9"]).validate(1)
    parse_config(["--dataset", "text", "--optimizer", "sgd", "--momentum", "0.8"]).validate(1)  # SGD reads it
    with pytest.raises(SystemExit):
        parse_config(["--optimizer", "lamb"], quiet=True)


def test_adamw_holds_two_moments_per_parameter_as_the_memory_model_predicts():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 3))  # 73 floats: 292 bytes, 4 tensors
    settings = parse_config(["--dataset", "cifar10", "--optimizer", "adamw"]).optimizer_settings
    optimizer = OPTIMIZERS["adamw"].build(model.parameters(), settings)
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
    measured = held_bytes(model, optimizer)["optimizer_bytes"]
    assert measured == 2 * 292 + 4 * 4  # the moments, and each parameter's step count (one float)
    assert state_slots(settings) == 2
    assert predict_memory(AllReduce, model, 4, state_slots(settings)).optimizer == 2 * 292
    sgd = parse_config(["--dataset", "cifar10"]).optimizer_settings
    assert predict_memory(AllReduce, model, 4, state_slots(sgd)).optimizer == 292
    no_momentum = parse_config(["--dataset", "cifar10", "--momentum", "0"]).optimizer_settings
    assert state_slots(no_momentum) == 0


def test_zero_torch_shards_an_adamw_with_the_jobs_settings(one_rank_group):
    torch.manual_seed(0)
    model, reference = nn.Linear(4, 2), nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    settings = parse_config(["--dataset", "text"]).optimizer_settings

    def build(params):
        return OPTIMIZERS["adamw"].build(params, settings)

    sharded, plain = ZeroTorch().make_optimizer(model, build), build(reference.parameters())
    assert sharded.optim.__class__ is torch.optim.AdamW and sharded.optim.defaults["betas"] == ADAMW_BETAS
    inputs = torch.randn(3, 4)
    for net, optimizer in ((model, sharded), (reference, plain)):
        for _ in range(2):
            optimizer.zero_grad()
            net(inputs).square().sum().backward()
            optimizer.step()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(ours, theirs)


def adamw_after_one_step(rank: int) -> tuple[nn.Parameter, torch.optim.Optimizer]:
    """Rank `rank`'s parameter after one AdamW step on its own gradient, (rank + 1) * (1, 2, 3)."""
    param = nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([param], lr=0.1, betas=ADAMW_BETAS)
    param.grad = (rank + 1) * torch.arange(1.0, 4.0)
    optimizer.step()
    return param, optimizer


def average_on_rank(rank: int, store: str, queue) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        results = {}
        for choice in ("average", "reset"):
            method = LocalSGD(period=1, momentum=choice)
            param, optimizer = adamw_after_one_step(rank)
            method.optimizer = optimizer  # as make_optimizer keeps it
            method.average_momentum(everyone=True)
            results[choice] = {key: value.tolist() for key, value in optimizer.state[param].items()}
            before = param.tolist()
            param.grad = torch.arange(1.0, 4.0)
            optimizer.step()  # the step after the average
            results[choice + " step"] = (before, param.tolist())
        queue.put((rank, results))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it
        queue.put((rank, traceback.format_exc()))


def test_local_momentum_averages_adamws_moments_and_a_reset_starts_it_afresh(tmp_path):
    got = forked_ranks(average_on_rank, 2, str(tmp_path / "store"))
    own = [next(iter(adamw_after_one_step(rank)[1].state.values())) for rank in (0, 1)]
    got = {rank: {name: ({key: torch.tensor(value) for key, value in entry.items()} if isinstance(entry, dict)
                         else tuple(torch.tensor(value) for value in entry)) for name, entry in result.items()}
           for rank, result in got.items()}
    for rank in (0, 1):
        averaged = got[rank]["average"]
        for key in ("exp_avg", "exp_avg_sq"):  # the mean of the two ranks' moments, on both
            assert torch.allclose(averaged[key], (own[0][key] + own[1][key]) / 2), key
        assert averaged["step"] == 1  # the step count is every rank's own, and the same
        assert all(torch.count_nonzero(value) == 0 for value in got[rank]["reset"].values())
    # after a reset the next step is a fresh AdamW's first (bias correction included), not a tiny one
    before, after = got[0]["reset step"]
    fresh = nn.Parameter(before.clone())
    first = torch.optim.AdamW([fresh], lr=0.1, betas=ADAMW_BETAS)
    fresh.grad = torch.arange(1.0, 4.0)
    first.step()
    assert torch.equal(after, fresh.detach())
    assert not torch.equal(*got[0]["average step"])  # and after an average the job steps on
