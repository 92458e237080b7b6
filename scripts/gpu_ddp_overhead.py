"""Where DistributedDataParallel's step time goes on one GPU: VGG-11's bare loop against DDP as torch builds it, DDP
without its buffers' broadcast, DDP with gradients as bucket views, and DDP under a Python comm hook (as `ddp` ran
on GPUs before it left the hook out there), each free-running and synchronised every step; then a profile of the last.

    python scripts/gpu_ddp_overhead.py [BATCH] [STEPS]        # one process: NCCL on a GPU (Gloo on a CPU)

Figures: docs/results.md ("What a GPU step costs against a bare loop").
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from mpi_train.config import TrainConfig
from mpi_train.data import synthetic_batch

BATCH = int(sys.argv[1]) if len(sys.argv) > 1 else 256
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 60
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda", 0) if CUDA else torch.device("cpu")


def timed(name: str, net: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(net(inputs), labels).backward()
        optimizer.step()

    def per_step(sync_each: bool) -> float:
        if CUDA:
            torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(STEPS):
            step()
            if sync_each and CUDA:
                torch.cuda.synchronize()
        if CUDA:
            torch.cuda.synchronize()
        return (time.perf_counter() - began) / STEPS * 1e3

    for _ in range(min(10, STEPS)):
        step()
    print(f"{name:<40} {per_step(False):7.2f} ms/step free-running, {per_step(True):7.2f} ms/step synchronised "
          f"each step", flush=True)
    return step


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    dist.init_process_group("nccl" if CUDA else "gloo", rank=0, world_size=1, **({"device_id": DEVICE} if CUDA else {}))
    torch.backends.cudnn.benchmark = True
    workload = TrainConfig(model="vgg11", dataset="synthetic")
    inputs, labels = (part.to(DEVICE) for part in synthetic_batch(workload, BATCH))
    ids = [0] if CUDA else None

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return workload.make_model().to(DEVICE)

    timed("bare", model(), inputs, labels)
    timed("DDP", DistributedDataParallel(model(), device_ids=ids), inputs, labels)
    timed("DDP broadcast_buffers=False", DistributedDataParallel(model(), device_ids=ids, broadcast_buffers=False),
          inputs, labels)
    timed("DDP gradient_as_bucket_view", DistributedDataParallel(model(), device_ids=ids,
                                                                 gradient_as_bucket_view=True), inputs, labels)
    hooked = DistributedDataParallel(model(), device_ids=ids)
    hooked.register_comm_hook(None, lambda state, bucket: default_hooks.allreduce_hook(state, bucket))
    step = timed("DDP + a Python comm hook", hooked, inputs, labels)
    if CUDA:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        print(profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=50))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
