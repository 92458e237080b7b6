"""Run under mpirun: the sharded methods against allreduce, for docs/results.md ("Whether every method trains the
same model").

1. Optimizer state per rank, measured from the tensors: each method's job optimizer
   (SyncMethod.make_optimizer, SGD with momentum, as training builds it) after one step of
   the model on random data; the bytes of the storages of its state, as a job's memory
   section counts them (memory.held_bytes: a DTensor's local shard for fsdp;
   ZeroRedundancyOptimizer's local optimizer's, .optim.state, since its own .state stays
   empty), per rank.
2. Equality: one short training job per method (dropout off, the same seed and global
   batch, the tests' rate of 0.05), its logged losses against allreduce's: the largest
   relative difference; bucketed and ring, which sum the same gradients in another order,
   show what rounding alone does in the same job.

    mpirun -np 4 python scripts/sharded_check.py OUT [--model mnist_cnn] [--steps 12] [--lr 0.05]
    mpirun -np 4 python scripts/sharded_check.py OUT --model gpt --lr 0.003 --methods lossless   # every lossless one

The optimizer state (1.) is measured for the image models, the equality (2.) for any model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mpi_train.cluster import Cluster, exit_process
from mpi_train.commands.train import parse_config
from mpi_train.config import TrainConfig
from mpi_train.memory import held_bytes
from mpi_train.models import INPUT_SHAPES, build_model
from mpi_train.sync import build_method
from mpi_train.train import run

METHODS = ("allreduce", "zero", "fsdp", "zero_torch", "bucketed", "ring")  # the last two: sums in another order
SHARDED = ("zero", "fsdp", "zero_torch")
LOSSLESS = ("allreduce", "gather_scatter", "ddp", "flat", "bucketed", "ring", "hierarchical", *SHARDED)


def optimizer_state_bytes(name: str, model_name: str, batch: int) -> int:
    """This rank's optimizer state after one step under `name` (collective)."""
    torch.manual_seed(0)
    model = build_model(model_name, dropout=0.0)
    method = build_method(name, TrainConfig(sync=name))
    net = method.wrap(model)
    optimizer = method.make_optimizer(model, lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9))
    images, labels = torch.randn(batch, *INPUT_SHAPES[model_name]), torch.randint(0, 10, (batch,))
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(net(images), labels).backward()
    method.sync(model)
    optimizer.step()
    method.after_step(model)
    # counted as a job counts it (distinct storages; ZeroRedundancyOptimizer's shard is in its local optimizer, .optim)
    return held_bytes(model, optimizer, method)["optimizer_bytes"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", default="mnist_cnn")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", default="0.05", help="the rate of every job (default: 0.05, the tests')")
    parser.add_argument("--methods", help="comma-separated, allreduce first, or `lossless` for every lossless method "
                        "(default: the sharded ones, with bucketed and ring)")
    args = parser.parse_args()
    methods = (LOSSLESS if args.methods == "lossless" else tuple(args.methods.split(",")) if args.methods
               else METHODS)
    cluster = Cluster.from_mpi()
    world, main_rank = cluster.info.world_size, cluster.info.is_main
    out = Path(args.out)
    cluster.open_process_group("gloo", None, 120)
    measured = [name for name in ("allreduce", *SHARDED) if name in methods] if args.model in INPUT_SHAPES else []
    held = {name: cluster.gather(optimizer_state_bytes(name, args.model, 8)) for name in measured}
    dist.destroy_process_group()
    batch = 48 * world  # divides by 2, 3 and 4
    for name in methods:
        argv = ["--model", args.model, "--dataset", "synthetic", "--synthetic-size", str(batch * args.steps),
                "--batch-size", str(batch), "--max-steps", str(args.steps), "--log-every", "1", "--dropout", "0",
                "--lr", args.lr, "--lr-schedule", "constant", "--warmup-steps", "0", "--no-tracking", "--sync", name,
                "--summary-json", str(out / f"{name}-np{world}.json")]
        run(parse_config(argv, quiet=True), cluster)
    if main_rank:
        losses = {name: [s["loss"] for s in json.loads((out / f"{name}-np{world}.json").read_text())["steps"]]
                  for name in methods}
        print(f"{world} ranks, {args.model}, global batch {batch}, {args.steps} steps at lr {args.lr}, dropout off")
        print(f"{'method':<11} {'max rel. loss gap to allreduce':>31} {'optimizer state per rank (bytes)':>40}")
        for name in methods:
            gap = max(abs(a - b) / abs(b) for a, b in zip(losses[name], losses["allreduce"]))
            state = (f"{', '.join(f'{b:,}' for b in held[name]):>28} ({max(held[name]) / max(held['allreduce']):.3f}x)"
                     if name in held else "")
            print(f"{name:<11} {gap:>31.2e} {state}")


if __name__ == "__main__":
    main()
    exit_process(0)  # as `python -m mpi_train` does: interpreter teardown can abort under Gloo's threads
