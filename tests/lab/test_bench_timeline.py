"""The timeline bench's accounting, read from traces made by the timeline's own writer (its runs are a command
with figures in docs/results.md, not a test)."""

from __future__ import annotations

import json

import pytest

from mpi_train import timeline
from mpi_train.lab import bench_timeline
from mpi_train.timeline import Alignment, Message, Step


def write_trace(tmp_path, per_rank_steps):
    events = [timeline.step_events(rank, steps, 0.0, []) for rank, steps in enumerate(per_rank_steps)]
    document = timeline.trace(events, ["a"] * len(events), [Alignment()] * len(events), {})
    path = tmp_path / "job.trace.json"
    path.write_text(json.dumps(document))
    return path


def test_messages_and_the_wait_are_held_against_the_sync_phase(tmp_path):
    # bounds: data, forward, backward, sync, optimizer starts, and the end (seconds)
    # rank 0's blocking collective starts at once and waits inside it for rank 1, which arrives 50 ms later
    early = Step(1, bounds=(0.0, 0.01, 0.02, 0.10, 0.20, 0.21), messages=[Message("allreduce", 0.10, 0.20)])
    late = Step(1, bounds=(0.0, 0.01, 0.02, 0.15, 0.20, 0.21), messages=[Message("allreduce", 0.15, 0.198)])
    errors = bench_timeline.trace_accounts(write_trace(tmp_path, [[early], [late]]))
    # rank 0: 50 ms of wait and 50 ms of transfer (not 100 + 50): all of its 100 ms sync; rank 1: 48 of 50 ms
    assert sorted(errors) == pytest.approx([-0.04, 0.0], abs=1e-6)


def test_the_overlap_counts_message_time_before_the_last_gradient(tmp_path):
    step = Step(1, bounds=(0.0, 0.01, 0.02, 0.12, 0.13, 0.14), gradients=[(1, 0.04), (0, 0.10)],
                messages=[Message("bucket", 0.08, 0.12, bucket=0), Message("bucket", 0.05, 0.07, bucket=1)])
    # 20 of the first bucket's 40 ms and all of the second's 20 ms ran before the last gradient (at 100 ms)
    assert bench_timeline.overlap_share(write_trace(tmp_path, [[step]])) == pytest.approx(40 / 60, abs=1e-6)


def test_the_split_arithmetic_is_the_worst_logged_step():
    summary = {"steps": [{"sync_wait_s": 0.1, "sync_transfer_s": 0.2, "sync_time_s": 0.3},
                         {"sync_wait_s": 0.0, "sync_transfer_s": 0.102, "sync_time_s": 0.1},
                         {"sync_wait_s": 0.0, "sync_transfer_s": 0.0, "sync_time_s": 0.0}]}
    assert bench_timeline.split_arithmetic(summary) == pytest.approx(0.02)
