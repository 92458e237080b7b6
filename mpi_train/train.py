"""The training job: set up, then forward, backward, sync, step, with each phase timed on every rank."""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import cluster as clusters
from . import netmodel
from . import tracking
from .checkpoint import Checkpointer, Position, load_for_resume, restore_rank_state
from .cluster import Cluster
from .config import TrainConfig
from .data import load_datasets, make_loaders
from .errors import UserError
from .faults import injected
from .models import build_model
from .report import PHASES, Reporter, SilentReporter
from .sync import SYNC_METHODS



def seed_everything(seed: int) -> None:
    """The same seed on every rank, before the model is built, so replicas start identical."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def parameter_digest(model: nn.Module) -> str:
    """A hash of every parameter's exact bytes: equal digests mean identical replicas."""
    digest = hashlib.sha256()
    for tensor in model.parameters():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def check_replicas_agree(cluster: Cluster, model: nn.Module, when: str) -> None:
    """Compare every rank's parameter digest with rank 0's; collective."""
    digests = cluster.allgather(parameter_digest(model))
    differing = [rank for rank, d in enumerate(digests) if d != digests[0]]
    if differing:
        raise UserError(
            f"{when}, rank(s) {differing} hold different weights from rank 0. Every rank must run "
            f"the same code, torch version and --seed; a sync method that does not average every "
            f"gradient also causes this."
        )


class Clock:
    """perf_counter that first waits for queued GPU work, so phases are charged correctly."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


@dataclass
class PhaseTotals:
    """Sums of per-step phase times on this rank, for window and whole-run means."""

    steps: int = 0
    sums: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    def add(self, times: dict) -> None:
        self.steps += 1
        for key in PHASES:
            self.sums[key] += times[key]

    def means(self) -> dict:
        return {key: total / max(1, self.steps) for key, total in self.sums.items()}


def evaluate(model: nn.Module, loader, device: torch.device, cluster: Cluster) -> tuple[float, float]:
    """Test loss and accuracy over the whole test set: each rank scores its shard, then the sums are reduced."""
    model.eval()
    totals = np.zeros(3)  # loss sum, correct, count
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            totals += (F.cross_entropy(logits, labels, reduction="sum").item(), (logits.argmax(1) == labels).sum().item(), len(labels))
    model.train()
    reduced = torch.tensor(totals, dtype=torch.float64, device=device)
    if cluster.info.world_size > 1:
        dist.all_reduce(reduced)  # the process group's timeout covers a peer stuck in its own evaluation
    loss_sum, correct, count = reduced.tolist()
    return loss_sum / count, correct / count


def run(config: TrainConfig, cluster: Cluster) -> None:
    """One training job on every rank of `cluster`."""
    info = cluster.info
    config.validate(info.world_size)
    connection = tracking.connect(config, cluster)  # rank 0 checks the tracking store now, before any work
    fault = injected()  # a no-op unless a test names a failure to inject
    fault.at(info.rank, "start")
    threads = clusters.configure_threads(info, config.threads)
    backend, device_name = clusters.resolve_backend(cluster, config.backend)
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)

    train_set, test_set = load_datasets(config, cluster)
    batch_per_rank = config.per_rank(info.world_size)
    train_loader, sampler, test_loader = make_loaders(train_set, test_set, cluster, batch_per_rank, config.seed)
    fault.at(info.rank, "rendezvous")
    rendezvous = clusters.init_process_group(cluster, backend, config.master_addr, config.timeout)

    seed_everything(config.seed)
    model = build_model(config.model_name, config.dropout).to(device)
    check_replicas_agree(cluster, model, "at start")
    method = SYNC_METHODS[config.sync].from_config(config)
    net = method.wrap(model)
    sync_model = netmodel.job_model(config, cluster, model, device)  # the sync time the alpha-beta model expects
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)

    steps_per_epoch = len(train_loader)
    total_steps = min(config.epochs * steps_per_epoch, config.max_steps or float("inf"))
    checkpoints = Checkpointer(config, cluster)
    resume = load_for_resume(config, cluster, total_steps)
    if resume:  # the weights and momentum of the checkpoint; each rank's random state comes right before its first batch
        model.load_state_dict(resume.model_state)
        optimizer.load_state_dict(resume.optimizer_state)
    job = {
        "world_size": info.world_size, "backend": backend, "hosts": list(cluster.hosts), "threads": threads, "rendezvous": rendezvous,
        "batch_size_per_rank": batch_per_rank, "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
        **netmodel.job_placement(cluster.hosts),
    }
    if resume:
        job["resumed_from"] = {"checkpoint": str(resume.path), "step": resume.position.step, "run_id": resume.parent_run_id}
    tracker = tracking.start(connection, config, cluster, job)
    reporter = Reporter(config.as_dict(), config.batch_size, config.summary_json, tracker=tracker,
                        predict_sync=sync_model.sync_time if sync_model else None) if info.is_main else SilentReporter()
    with tracker:  # ends the MLflow runs FINISHED, FAILED (any rank raised) or KILLED (SIGTERM/SIGINT)
        reporter.start(job)
        clock = Clock(device)
        run_totals, window = PhaseTotals(), PhaseTotals()
        started = time.perf_counter()
        start = resume.position if resume else Position()
        step = start.step
        for epoch in range(start.epoch, config.epochs + 1):
            if step >= total_steps:
                break
            sampler.set_epoch(epoch - 1)
            step_in_epoch = start.step_in_epoch if epoch == start.epoch else 0
            sampler.skip_next(step_in_epoch * batch_per_rank)  # a resumed epoch skips the batches already trained on
            epoch_started = time.perf_counter()
            batches = iter(train_loader)
            if resume and epoch == start.epoch:
                restore_rank_state(resume.rank_state, model)  # after iter(): it draws a seed from torch's generator
            while step < total_steps:
                t0 = clock()
                batch = next(batches, None)
                if batch is None:
                    break
                images, labels = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
                t1 = clock()
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(net(images), labels)
                loss.backward()
                fault.at(info.rank, step + 1)
                cluster.note_progress(step + 1)  # lets a rank whose collective times out name who is behind
                t2 = clock()  # after the bookkeeping above, so that sync time is the sync alone
                method.sync(model)
                t3 = clock()
                optimizer.step()
                t4 = clock()
                step += 1
                step_in_epoch += 1

                times = {"data_time_s": t1 - t0, "compute_time_s": t2 - t1, "sync_time_s": t3 - t2,
                         "optimizer_time_s": t4 - t3, "step_time_s": t4 - t0}
                if config.check_every and step % config.check_every == 0:
                    check_replicas_agree(cluster, model, f"at step {step}")
                run_totals.add(times)
                window.add(times)
                if step % config.log_every == 0 or step == total_steps or step % steps_per_epoch == 0:
                    per_rank = cluster.gather({"loss": loss.item(), **window.means(), **tracker.host_sample()})
                    reporter.log_step(epoch, step, total_steps, per_rank)
                    window = PhaseTotals()
                if checkpoints.due(step, total_steps):
                    checkpoints.save(model, optimizer, Position(epoch, step, step_in_epoch), tracker.parent_id)

            fault.at(info.rank, "eval")
            cluster.note_progress(step + 0.5)  # past step `step`'s sync, not yet at the next one's
            method.sync_buffers(model)
            test_loss, test_accuracy = evaluate(model, test_loader, device, cluster)
            reporter.log_epoch(epoch, test_loss, test_accuracy, time.perf_counter() - epoch_started)

        check_replicas_agree(cluster, model, f"after step {step}")
        reporter.finish(cluster.gather(run_totals.means()), time.perf_counter() - started)
        if config.save_model:
            reporter.save_weights(model)
    dist.destroy_process_group()
