"""Run under mpirun: every registered sync method must leave each rank holding the mean gradient.

The expected mean is computed by hand in each process: it replays every rank's
backward pass locally (rank r feeds inputs filled with r + 1 + step) and averages
them. Each method runs three steps on one instance, so buffers and hooks reused
from step to step are checked too. Besides every registered method, a few cases
stress the methods that pack gradients into buffers: buckets of a few bytes (one
per tensor, filled out of order), a layer used twice in forward (its gradient
accumulates from two places before it is ready) and a layer never used (its
gradient must stay None, as `allreduce` leaves it). A method that sends float16 or
bfloat16 is held to that type's rounding instead of float32's. `hierarchical` also
runs with its levels placed by hand (hosts of 2 ranks), as across real hosts. Every
schedule that takes a compression runs with each: fp16 and bf16 within their
precision; PowerSGD (rank 1, plain first step) must give the exact mean on its plain
step, the same update on every rank, and keep the error-feedback invariant: applied
update + mean of the new residuals == mean gradient + mean of the previous residuals,
with at least one matrix factored (not all sent whole).
The model's 785 parameters do not divide into 2, 3 or 4 equal chunks, which `ring`
must handle. A method that cannot run on Gloo is listed as unavailable; one that averages
parameters rather than gradients (localsgd, diloco) is checked by tests/test_averaging.py.
A method that shards the gradients or the optimizer state (zero, fsdp, zero_torch) holds
no mean gradient to check: it steps its optimizer (SGD with momentum and weight decay,
through its make_optimizer) and must leave every rank the parameters that SGD over the
whole model reaches from the hand-computed means, to float32 rounding, at world sizes
that do not divide the model's 785 numbers (its shards are padded).
Prints one line per case on rank 0; exits non-zero if any rank saw a wrong gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from mpi_train.cluster import Cluster, exit_process
from mpi_train.config import TrainConfig
from mpi_train.sync import GRADIENTS, SYNC_METHODS, WHOLE_VIEW, SyncMethod, backend_error, build_method
from mpi_train.sync.base import REPLICATED, compressor_for
from mpi_train.sync.bucketed import Bucketed
from mpi_train.sync.flat import Flat
from mpi_train.sync.hierarchical import Hierarchical, host_of_each_rank
from mpi_train.sync.ring import Ring
from mpi_train.sync.zero import Zero

STEPS = 3
COMPRESSING = ("allreduce", "flat", "bucketed", "ring", "hierarchical")


WIDTH = 23  # a 23 x 23 weight is the one matrix PowerSGD factors at rank 1 (529 numbers > 10 x 46); the rest go whole


class SharedAndUnused(nn.Module):
    """`hidden` runs twice per forward; `unused` never runs."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Linear(5, 2)  # registered first, so it is the last bucket in backward order
        self.inp, self.hidden, self.out = nn.Linear(6, WIDTH), nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(torch.tanh(self.hidden(torch.tanh(self.inp(x)))))))


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 3))


def make_shared_and_unused() -> nn.Module:
    torch.manual_seed(0)
    return SharedAndUnused()


def backward(net: nn.Module, rank: int, step: int) -> None:
    inputs = torch.full((4, 6), float(rank + 1 + step)) + torch.arange(6.0)
    net(inputs).pow(2).sum().backward()


def local_gradients(model: nn.Module, rank: int, step: int) -> list[torch.Tensor | None]:
    model.zero_grad()
    backward(model, rank, step)
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def every_ranks_gradients(make: Callable[[], nn.Module], world: int, step: int) -> list[list[torch.Tensor | None]]:
    reference = make()
    return [local_gradients(reference, r, step) for r in range(world)]


def mean(per_rank: list[list[torch.Tensor | None]]) -> list[torch.Tensor | None]:
    return [None if grads[0] is None else torch.stack(grads).mean(0) for grads in zip(*per_rank)]


def gradients_are(model: nn.Module, per_rank: list[list[torch.Tensor | None]], wire_dtype: torch.dtype | None) -> bool:
    """Each .grad is the mean of the ranks' gradients: to float32 rounding, or for a method that sends another
    dtype, within what rounding each rank's share to it and summing N of them in it can cost."""
    for p, e, grads in zip(model.parameters(), mean(per_rank), zip(*per_rank)):
        if (p.grad is None) != (e is None):
            return False
        if e is None:
            continue
        if wire_dtype is None:
            close = torch.allclose(p.grad, e, rtol=1e-6, atol=1e-7)
        else:
            bound = len(grads) * torch.finfo(wire_dtype).eps * max(g.abs().max() for g in grads)
            close = bool((p.grad - e).abs().max() <= bound)
        if not close:
            return False
    return True


def hosts_of_two(world: int) -> list[int]:
    """Each rank's leader when hosts hold 2 ranks each: [0, 0, 2] at np 3, [0, 0, 2, 2] at np 4."""
    return [r - r % 2 for r in range(world)]


def compressed(sync: str, compression: str, world: int, **options) -> Callable[[], SyncMethod]:
    def make() -> SyncMethod:
        config = TrainConfig(sync=sync, compression=compression, powersgd_rank=1, powersgd_start_step=1, **options)
        if sync == "hierarchical":
            return Hierarchical(compressor_for(Hierarchical, config), hosts=hosts_of_two(world))
        return build_method(sync, config)
    return make


def cases(world: int) -> dict[str, tuple[Callable[[], SyncMethod], Callable[[], nn.Module]]]:
    """Name -> (method factory, model factory), for the methods that can run on Gloo."""
    tiny_buckets = 64 / 2**20  # 64 bytes: every tensor of these models gets its own bucket
    return {
        **{name: (method_class, make_model) for name, method_class in SYNC_METHODS.items()
           if not backend_error(name, "gloo") and method_class.traits.averages == GRADIENTS
           and method_class.traits.shards == REPLICATED},
        "bucketed, 64-byte buckets": (lambda: Bucketed(tiny_buckets), make_model),
        "bucketed, 64-byte buckets, shared + unused layers": (lambda: Bucketed(tiny_buckets), make_shared_and_unused),
        "bucketed, one bucket, shared + unused layers": (Bucketed, make_shared_and_unused),
        "flat, shared + unused layers": (Flat, make_shared_and_unused),
        "ring, shared + unused layers": (Ring, make_shared_and_unused),
        "hierarchical, hosts of 2 ranks": (lambda: Hierarchical(hosts=hosts_of_two(world)), make_model),
        "hierarchical, hosts of 2 ranks, shared + unused layers": (lambda: Hierarchical(hosts=hosts_of_two(world)),
                                                                   make_shared_and_unused),
        **{f"{sync}+{compression}": (compressed(sync, compression, world), make_model)
           for sync in COMPRESSING for compression in ("fp16", "bf16", "powersgd")},
        "bucketed+powersgd, 64-byte buckets, shared + unused layers":
            (compressed("bucketed", "powersgd", world, bucket_mb=tiny_buckets), make_shared_and_unused),
    }


def sharded_cases() -> dict[str, Callable[[], SyncMethod]]:
    """Name -> method factory, for the methods that shard (checked by the parameters they step to)."""
    return {**{name: method_class for name, method_class in SYNC_METHODS.items()
               if method_class.traits.shards != REPLICATED and not backend_error(name, "gloo")},
            "zero, 64-byte buckets": lambda: Zero(64 / 2**20)}


def sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=0.01)


def stepped_by_hand(world: int) -> list[torch.Tensor]:
    """The parameters SGD over the whole model reaches in STEPS steps of every rank's mean gradient."""
    reference = make_model()
    optimizer = sgd(reference.parameters())
    for step in range(STEPS):
        per_rank = every_ranks_gradients(lambda: reference, world, step)
        for param, gradient in zip(reference.parameters(), mean(per_rank)):
            param.grad = gradient
        optimizer.step()
    return [p.detach().clone() for p in reference.parameters()]


def steps_as_sgd_does(make_method: Callable[[], SyncMethod], rank: int, expected: list[torch.Tensor]) -> bool:
    model = make_model()
    method = make_method()
    net = method.wrap(model)
    optimizer = method.make_optimizer(model, sgd)
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        backward(net, rank, step)
        method.sync(model)
        optimizer.step()
        method.after_step(model)
    whole = method.tensors(model, WHOLE_VIEW)
    return all(torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6) for ours, theirs in zip(whole, expected))


def residuals(method: SyncMethod, model: nn.Module) -> list[torch.Tensor]:
    """This rank's PowerSGD residual per parameter (zeros where a tensor is sent whole)."""
    return [r.clone() if (r := method.compressor.residual_of(p)) is not None else torch.zeros_like(p)
            for p in model.parameters()]


def keeps_error_feedback(cluster: Cluster, method: SyncMethod, model: nn.Module, previous: list[torch.Tensor],
                         per_rank: list[list[torch.Tensor | None]]) -> bool:
    """Every rank applies the same update, and update + mean(new residuals) == mean(grads) + mean(old residuals)."""
    applied = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    everyone = cluster.allgather((applied, previous, residuals(method, model)))
    for i, update in enumerate(applied):
        if update is None:
            continue
        if any(not torch.equal(rank_applied[i], update) for rank_applied, _, _ in everyone):
            return False
        left = update + torch.stack([new[i] for _, _, new in everyone]).mean(0)
        right = torch.stack([grads[i] + old[i] for grads, (_, old, _) in zip(per_rank, everyone)]).mean(0)
        if (left - right).abs().max() > 1e-5 * max(1.0, right.abs().max().item()):
            return False
    return True


def main() -> int:
    cluster = Cluster.from_mpi()
    rank, world = cluster.info.rank, cluster.info.world_size
    cluster.open_process_group("gloo", None, 60)
    failures = []
    leaders = host_of_each_rank()  # what the registered `hierarchical` builds its levels from
    for name, (make_method, make) in cases(world).items():
        model = make()
        method = make_method()
        net = method.wrap(model)
        powersgd = method.compressor.name == "powersgd"
        for step in range(STEPS):
            model.zero_grad()
            backward(net, rank, step)
            previous = residuals(method, model) if powersgd else None
            method.sync(model)
            per_rank = every_ranks_gradients(make, world, step)
            differs_from_local = any(g is not None and not torch.equal(p.grad, g)
                                     for p, g in zip(model.parameters(), per_rank[rank]))
            if powersgd and step >= method.compressor.start_step:
                factored = any(method.compressor.residual_of(p) is not None for p in model.parameters())
                right = factored and keeps_error_feedback(cluster, method, model, previous, per_rank)
            else:
                right = gradients_are(model, per_rank, method.traits.wire_dtype)
            if not (right and (differs_from_local or world == 1)):
                failures.append(name)
                break
    expected = stepped_by_hand(world)
    for name, make_method in sharded_cases().items():
        if not steps_as_sgd_does(make_method, rank, expected):
            failures.append(name)
    everyone = cluster.gather(failures)
    if rank == 0:
        for name in cases(world):
            bad = [r for r, names in enumerate(everyone) if name in names]
            right = ("one update and error feedback kept on every rank" if "powersgd" in name
                     else "mean gradient on every rank")
            print(f"{name}: {right if not bad else f'WRONG on ranks {bad}'}")
        for name in sharded_cases():
            bad = [r for r, names in enumerate(everyone) if name in names]
            print(f"{name}: {'the parameters of SGD over the whole model' if not bad else f'WRONG on ranks {bad}'}"
                  f" on every rank")
        print(f"hierarchical: MPI's host split found {len(set(leaders))} host(s), leaders {sorted(set(leaders))}")
        for name, method_class in SYNC_METHODS.items():
            if backend_error(name, "gloo"):
                print(f"{name}: unavailable on gloo")
            elif method_class.traits.averages != GRADIENTS:
                print(f"{name}: averages {method_class.traits.averages}, not gradients (tests/test_averaging.py)")
    failed = any(cluster.allgather(bool(failures)))
    dist.destroy_process_group()  # before exit: Gloo's threads must not outlive the interpreter
    return 1 if failed else 0


if __name__ == "__main__":
    exit_process(main())
