"""The summary a job writes, from a Reporter fed real records in one process: its keys in the order its readers
know, a part a job lacks left out, and every record kept whether the console printed it or not."""

from __future__ import annotations

import json

from conftest import filled

from mpi_train.config import JobInfo
from mpi_train.liveness import Stall
from mpi_train.netmodel.memory import MemoryPrediction
from mpi_train.outputs.summary import Ending
from mpi_train.reporter import PHASES, Reporter
from mpi_train.timeline import Alignment, StepRecorder

JOB = JobInfo(world_size=2, backend="gloo", hosts=("h1", "h2"), threads=1, rendezvous="h1:1234",
              batch_size_per_rank=32, steps_per_epoch=2, total_steps=2)
CONFIG = {"sync": "allreduce", "model": "mnist_cnn", "dataset": "synthetic"}


def rank_record(step: int, rank: int) -> dict:
    """One rank's figures of a step as the loop gathers them, with the arrival its split is made of."""
    return {"loss": 2.0 / step, "data_time_s": 0.01, "compute_time_s": 0.1, "sync_time_s": 0.05,
            "optimizer_time_s": 0.01, "step_time_s": 0.2,
            "steps": [{"step": step, "arrival": 0.01 * rank, "region": 0.05, "comm": 0.04, "in_backward": 0.01}]}


def test_the_summary_holds_every_record_in_its_parts_order_and_the_console_prints_the_end(tmp_path):
    lines, path = [], tmp_path / "summary.json"
    reporter = Reporter(CONFIG, 64, str(path), print_fn=lines.append)
    reporter.start(JOB)
    for step in (1, 2):
        reporter.log_step(1, step, [rank_record(step, rank) for rank in range(2)], lr=0.1)
    reporter.note_stall(Stall("h2", (1,), 2, 3.5))
    reporter.log_eval(1, 1.2, 0.4, 1.0, 2e6)
    reporter.log_epoch(1, 2, 1.0, 0.5, 4.0)
    reporter.log_eval(2, 1.0, 0.5, 2.0, 4e6, epoch_end=True)
    reporter.end_progress()
    held = {"parameters_bytes": 2**20, "gradients_bytes": 2**20, "optimizer_bytes": 2**20, "total_bytes": 3 * 2**20}
    reporter.memory([held, held], MemoryPrediction(2**20, 2**20, 2**20))
    reporter.compiled_after_setup(0)
    reporter.finish([dict.fromkeys(PHASES, 0.5)] * 2, 9.0, [dict.fromkeys(PHASES, 0.25)] * 2, 1, [0.1, 0.1])
    summary = json.loads(path.read_text())
    assert list(summary) == [
        "config", *JOB.as_dict(), "samples_per_step", "steps", "epochs", "evaluations", "per_rank_mean_times",
        "per_rank_mean_times_after_warmup", "mean_times", "timing_warmup_steps", "mean_times_after_warmup",
        "final_loss", "memory", "network_stalls", "sync_split_after_warmup", "recorder_busy_s", "clock_alignment",
        "graphs_compiled_after_setup", "wall_time_s", "finished_at"]
    assert [row["step"] for row in summary["steps"]] == [1, 2] and summary["final_loss"] == 1.0
    assert summary["samples_per_step"] == 64
    assert summary["steps"][0]["sync_wait_s"] == 0.005 and summary["steps"][0]["slowest_rank"] == 1
    assert summary["sync_split_after_warmup"]["mean"]["sync_wait_s"] == 0.005  # step 2 alone, after the warm-up
    assert [row["step"] for row in summary["evaluations"]] == [1, 2] and summary["evaluations"][1]["sent_mb"] == 4.0
    assert summary["network_stalls"] == [{"host": "h2", "ranks": [1], "step": 2, "seconds": 3.5}]
    assert summary["graphs_compiled_after_setup"] == 0  # none compiled is still said
    assert summary["mean_times_after_warmup"]["step_time_s"] == 0.25 and summary["mean_times"]["step_time_s"] == 0.5
    assert sum(line.startswith("step 1 test loss") for line in lines) == 1
    assert not any(line.startswith("step 2 test loss") for line in lines)  # an epoch's end: the epoch's line says it
    assert "mpi_train: network stall: host h2 (rank 1) silent for 3.5 s from step 2; it answers again" in lines[-5]
    assert lines[-2].startswith("done in 9.0s: mean step 0.250s leaving out the first 1 step(s) (0.500s over all)")
    assert lines[-1].startswith("mpi_train: sync split: wait for the last rank 0.005s, transfer 0.045s")


def test_a_job_without_a_file_named_writes_none_and_leaves_out_what_it_lacks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = []
    reporter = Reporter(CONFIG, 64, None, print_fn=lines.append)
    reporter.start(JOB)
    reporter.finish([dict.fromkeys(PHASES, 0.5)] * 2, 1.0)
    assert list(tmp_path.iterdir()) == []
    summary = reporter.summary.build(reporter.job, Ending(per_rank_means=[dict.fromkeys(PHASES, 0.5)] * 2,
                                                          wall_time_s=1.0))
    for absent in ("memory", "sync_split_after_warmup", "throughput", "weights_sha256", "timeline",
                   "graphs_compiled_after_setup", "predicted_sync_time_s", "slow_host"):
        assert absent not in summary, absent
    assert summary["final_loss"] is None and summary["network_stalls"] == []



def test_a_disk_that_filled_leaves_no_half_file_and_the_end_says_what_is_missing_in_one_paragraph(small_disk):
    disk, lines = filled(small_disk), []
    config = {**CONFIG, "compression": "none", "timeline_dir": str(disk / "timelines")}
    reporter = Reporter(config, 64, str(disk / "summary.json"), print_fn=lines.append)
    reporter.start(JOB)
    assert reporter.unwritten() is None
    # no traceback: the timeline leaves nothing, nor the folder it made, and the run's other outputs still follow
    reporter.save_timeline([[], []], [Alignment(), Alignment()], StepRecorder(Alignment(), False, (1, 2)), None)
    reporter.finish([dict.fromkeys(PHASES, 0.5)] * 2, 9.0)
    assert lines[-1].startswith("done in 9.0s")
    assert sorted(path.name for path in disk.iterdir()) == ["filler"]
    message = " ".join(reporter.unwritten().split())
    assert message == (f"the job trained to its end, and its console lines and MLflow run (unless --no-tracking) "
                       f"hold its figures, but the timeline (--timeline-dir {disk / 'timelines'}: No space left on "
                       f"device) and the summary (--summary-json {disk / 'summary.json'}: No space left on device) "
                       f"could not be written. Free space there, or name another place for the next run.")
