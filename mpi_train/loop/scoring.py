"""The test set's loss and accuracy, and the wall time spent training with those evaluations left out."""

from __future__ import annotations

import contextlib
import itertools
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..cluster import Cluster
from ..step.precision import PRECISIONS, Precision
from ..sync import average_buffers
from ..sync.traits import EVERYTHING
from .job import Job


def evaluate(model: nn.Module, loader, device: torch.device, cluster: Cluster,
             precision: Precision = PRECISIONS["32-true"], in_step: bool = False) -> tuple[float, float]:
    """Test loss and accuracy over the whole test set: each rank scores its shard, then the sums are reduced. The
    forward runs at the job's precision, as training's does; the loss in float32. `in_step`: the model's forward is
    itself collective (FSDP's all-gathers), so every rank runs as many forwards as the rank with the most batches;
    its spare ones (a sample of a batch, uncounted) keep it in step where its shard holds fewer."""
    model.eval()
    totals = np.zeros(3)  # loss sum, correct, count
    batches = iter(loader)
    first = next(batches, None)
    spare = spare_forwards(loader, first, cluster) if in_step and cluster.info.world_size > 1 else []
    with torch.no_grad():
        for images, labels in itertools.chain([first] if first is not None else [], batches):
            images, labels = images.to(device), labels.to(device)
            with precision.autocast(device):
                logits = model(images).float()
                summed = F.cross_entropy(logits, labels, reduction="sum")
            totals += (summed.item(),
                       (logits.argmax(1) == labels).sum().item(), len(labels))
        for images in spare:
            with precision.autocast(device):
                model(images.to(device))
    model.train()
    reduced = torch.tensor(totals, dtype=torch.float64, device=device)
    # the process group's timeout covers a peer stuck in its own evaluation
    if cluster.info.world_size > 1:
        dist.all_reduce(reduced)
    loss_sum, correct, count = reduced.tolist()
    return loss_sum / count, correct / count


def spare_forwards(loader, first, cluster: Cluster) -> list[torch.Tensor]:
    """The inputs of the forwards this rank runs after its own batches, so that every rank runs as many (collective:
    the ranks' batch counts, and where a rank has none, another rank's first sample as its input)."""
    counts = cluster.allgather(len(loader))
    example = first[0][:1].cpu() if first is not None else None
    if min(counts) == 0 < max(counts):
        example = next(sample for sample in cluster.allgather(example) if sample is not None)
    return [example] * (max(counts) - len(loader))


def score(job: Job, cluster: Cluster) -> tuple[float, float]:
    """Test loss and accuracy of the model the job stands for (collective): buffers averaged, and for a method whose
    ranks hold their own models between averages, their mean (training goes on with each rank's own). Iterating the
    test loader draws a seed from torch's generator: its state is put back, so that scoring (--eval-every) leaves
    training's random draws, and so its losses, as they were."""
    average_buffers(job.model)
    random_state = torch.get_rng_state()
    try:
        with job.method.evaluated(job.model):
            return evaluate(job.model, job.test_loader, job.device, cluster, job.precision,
                            in_step=job.method.traits.shards == EVERYTHING)
    finally:
        torch.set_rng_state(random_state)


class Progress:
    """The job's wall time spent training, its test evaluations left out (time to accuracy), from where a resumed
    job's checkpoint left it."""

    def __init__(self, elapsed_s: float = 0.0):
        self.started, self.before, self.evaluating_s = time.perf_counter(), elapsed_s, 0.0

    def elapsed(self) -> float:
        return self.before + time.perf_counter() - self.started - self.evaluating_s

    @contextlib.contextmanager
    def evaluating(self):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.evaluating_s += time.perf_counter() - began
