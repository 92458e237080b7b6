"""bucketed cuts the same buckets as a real DistributedDataParallel, tensor for tensor, in autograd's order."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from mpi_train.models import INPUT_SHAPES, build_model
from mpi_train.sync.bucketed import Bucketed


def steps(net, model_name: str, count: int, after_backward=lambda: None) -> None:
    torch.manual_seed(1)
    images, labels = torch.randn(4, *INPUT_SHAPES[model_name]), torch.randint(0, 10, (4,))
    for _ in range(count):
        net.zero_grad(set_to_none=True)
        F.cross_entropy(net(images), labels).backward()
        after_backward()


def ddp_buckets(model_name: str) -> list[list[str]]:
    """The buckets DDP reduces once it has rebuilt them from its first iteration's order (from a comm hook)."""
    torch.manual_seed(0)
    model = build_model(model_name)
    names = {id(p): name for name, p in model.named_parameters()}
    wrapped, seen = DistributedDataParallel(model), []

    def listing(state, bucket):
        seen.append([names[id(p)] for p in bucket.parameters()])
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    wrapped.register_comm_hook(None, listing)
    steps(wrapped, model_name, 1)
    seen.clear()
    steps(wrapped, model_name, 1)
    return seen  # the second step's, after the rebuild


@pytest.mark.parametrize("model_name", ["vgg11", "mnist_cnn"])
def test_bucketed_cuts_the_buckets_ddp_cuts(one_rank_group, model_name):
    expected = ddp_buckets(model_name)
    torch.manual_seed(0)
    model = build_model(model_name)
    names = {id(p): name for name, p in model.named_parameters()}
    method = Bucketed()
    net = method.wrap(model)
    steps(net, model_name, 2, lambda: method.sync(model))
    ours = [[names[id(p)] for p in bucket.buffer.params] for bucket in method.buckets]
    assert ours == expected
    if model_name == "vgg11":  # 5 / 20 / 9 tensors: a layer's weight before its bias, as autograd hands them over
        assert [len(bucket) for bucket in ours] == [5, 20, 9]
        assert [sum(p.numel() * 4 for p in bucket.buffer.params) for bucket in method.buckets] == [
            9_461_800, 27_157_504, 305_152]


def test_bucketed_averages_exactly_in_its_first_step_and_after(one_rank_group):
    """The first step learns the order and reduces everything in sync(); later steps reduce during backward."""
    torch.manual_seed(0)
    model = build_model("mnist_cnn")
    method = Bucketed(bucket_mb=1.0)
    net = method.wrap(model)
    for step in range(3):
        steps(net, "mnist_cnn", 1)
        expected = [p.grad.clone() for p in model.parameters()]
        launched = method.next_to_launch
        method.sync(model)
        assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected))  # one rank: the mean is itself
        assert launched == (0 if step == 0 else len(method.buckets))  # after the first step all left during backward


class SkipsOnSomeSteps(torch.nn.Module):
    """A forward that leaves `branch` out of every second step: a branch the step decides."""

    def __init__(self):
        super().__init__()
        self.trunk, self.branch, self.calls = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3), 0

    def forward(self, images):
        self.calls += 1
        return self.trunk(images) + (self.branch(images) if self.calls % 2 else 0)


def test_a_forward_that_skips_a_branch_on_some_steps_is_one_paragraph_under_ddp_and_trains_under_bucketed(
        one_rank_group):
    from mpi_train.errors import UserError
    from mpi_train.sync.ddp import DDP

    images, labels = torch.randn(4, 4), torch.randint(0, 3, (4,))
    method = DDP()
    net = method.wrap(SkipsOnSomeSteps())
    with pytest.raises(UserError) as refused, method.explaining():
        for _ in range(3):  # DDP's own failure comes at the forward after the step that skipped
            F.cross_entropy(net(images), labels).backward()
    assert str(refused.value).startswith("parameters got no gradient in a step (branch.weight, branch.bias on rank "
                                         "0), though the model's forward used every parameter")
    assert "--sync bucketed" in str(refused.value) and "Traceback" not in str(refused.value)
    method = DDP()  # a last step that skipped leaves its gradients unaveraged: the job's end says so too
    net = method.wrap(SkipsOnSomeSteps())
    with pytest.raises(UserError, match=r"^parameters got no gradient in a step \(branch\.weight"), method.explaining():
        for _ in range(2):
            F.cross_entropy(net(images), labels).backward()
        method.finish(net.module)
    bucketed = Bucketed()
    net = bucketed.wrap(SkipsOnSomeSteps())
    for _ in range(3):
        net.zero_grad(set_to_none=True)
        F.cross_entropy(net(images), labels).backward()
        bucketed.sync(net)
