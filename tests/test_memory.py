"""Memory per rank, measured from the tensors: each storage once, by kind; torch's sharded optimizers on two ranks."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from torch import nn

from mpi_train.memory import describe, held_bytes, most, predicted
from mpi_train.sync import SyncMethod
from mpi_train.sync.flat import FlatBuffer

PROGRAM = REPO / "tests" / "rank_programs" / "memory_shards_check.py"


def trained(momentum: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 3))  # 55 + 18 = 73 floats: 292 bytes
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_momentum_sgd_holds_one_buffer_per_parameter_and_plain_sgd_none():
    model, optimizer = trained(momentum=0.9)
    figures = held_bytes(model, optimizer)
    assert figures == {"parameters_bytes": 292, "gradients_bytes": 292, "optimizer_bytes": 292, "total_bytes": 876}
    model, optimizer = trained(momentum=0.0)
    assert held_bytes(model, optimizer)["optimizer_bytes"] == 0


def test_views_of_one_buffer_count_once_whatever_reaches_them():
    model, optimizer = trained(momentum=0.0)
    buffer = FlatBuffer(list(model.parameters()))
    buffer.pack()
    buffer.unpack()  # each .grad is now a view of the buffer (flat, bucketed)

    class HoldsTheBuffer(SyncMethod):
        def _held(self):
            return {"gradients": [buffer.data], "optimizer": [buffer.data]}

    figures = held_bytes(model, optimizer, HoldsTheBuffer())
    assert figures["gradients_bytes"] == buffer.data.numel() * 4 == 292
    assert figures["optimizer_bytes"] == 0  # counted as gradients already


def test_a_methods_own_tensors_count_under_their_kind():
    model, optimizer = trained(momentum=0.0)

    class KeepsAShardCopy(SyncMethod):
        def _held(self):
            return {"parameters": [torch.zeros(25)], "optimizer": [torch.zeros(10)]}

    figures = held_bytes(model, optimizer, KeepsAShardCopy())
    assert figures["parameters_bytes"] == 292 + 100 and figures["optimizer_bytes"] == 40


def test_the_job_figure_is_the_most_any_rank_held():
    ranks = [{"parameters_bytes": 10, "total_bytes": 30}, {"parameters_bytes": 20, "total_bytes": 25}]
    assert most(ranks) == {"parameters_bytes": 20, "total_bytes": 30}
    assert describe({"parameters_bytes": 2**20, "gradients_bytes": 0, "optimizer_bytes": 2**21,
                     "total_bytes": 3 * 2**20}) == ("parameters 1.0 MiB, gradients 0.0 MiB, optimizer 2.0 MiB "
                                                    "(total 3.0 MiB)")


@pytest.mark.e2e
def test_torchs_sharded_optimizers_hold_their_share_on_two_ranks(tmp_path):
    out = tmp_path / "held.json"
    result = subprocess.run([sys.executable, str(PROGRAM), str(out)], check=False,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr
    ranks = json.loads(out.read_text())
    whole = ranks[0]["replicated"]
    assert whole["optimizer_bytes"] == whole["parameters_bytes"] == whole["gradients_bytes"]
    # ZeRO-1: the two ranks' optimizer state is one replica's, split (by whole tensors); the rest stays whole
    shares = [rank["zero_redundancy"]["optimizer_bytes"] for rank in ranks]
    assert sum(shares) == whole["optimizer_bytes"] and max(shares) < whole["optimizer_bytes"]
    assert all(rank["zero_redundancy"]["gradients_bytes"] == whole["gradients_bytes"] for rank in ranks)
    # ZeRO-3 (fully_shard): every kind is this rank's half (64 and 10 rows divide by 2: no padding)
    for rank in ranks:
        for kind in ("parameters_bytes", "gradients_bytes", "optimizer_bytes"):
            assert rank["fully_shard"][kind] == whole[kind] // 2, kind


def test_the_end_line_the_summary_and_the_jobs_metrics_carry_memory_per_rank(tmp_path):
    from mpi_train.netmodel.memory import MemoryPrediction
    from mpi_train.reporter import PHASES, Reporter
    from mpi_train.tracking import job_metrics

    lines, path = [], tmp_path / "summary.json"
    reporter = Reporter({"sync": "allreduce"}, 64, str(path), print_fn=lines.append)
    reporter.job = {"total_steps": 2, "world_size": 2}
    ranks = [{"parameters_bytes": 2**20, "gradients_bytes": 2**20, "optimizer_bytes": 2**20, "total_bytes": 3 * 2**20},
             {"parameters_bytes": 2**20, "gradients_bytes": 2**20, "optimizer_bytes": 2**21, "total_bytes": 4 * 2**20}]
    reporter.memory(ranks, MemoryPrediction(2**20, 2**20, 2**20))
    reporter.finish([dict.fromkeys(PHASES, 0.5)] * 2, 1.0)
    assert lines[0].endswith("memory per rank (the most any held): parameters 1.0 MiB, gradients 1.0 MiB, optimizer "
                             "2.0 MiB (total 4.0 MiB), model 3.0 MiB")
    summary = json.loads(path.read_text())
    assert summary["memory"]["per_rank"] == ranks and summary["memory"]["most"]["total_bytes"] == 4 * 2**20
    assert summary["memory"]["predicted"]["total_bytes"] == 3 * 2**20
    assert predicted({"total_bytes": 4 * 2**20, "gathered_bytes": 2**20}) == ("model 3.0 MiB (+1.0 MiB while a unit is "
                                                                             "gathered)")
    metrics = job_metrics(summary, 64)
    assert metrics["memory/total_bytes"] == 4 * 2**20 and metrics["memory/optimizer_bytes"] == 2**21
    assert metrics["memory/predicted_total_bytes"] == 3 * 2**20
