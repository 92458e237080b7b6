"""`python -m mpi_train compare` over real tracked jobs: the table, the plots, the comparison run."""

import subprocess
import sys

import pytest
from conftest import REPO, losses

from mpi_train.analysis.compare import COLUMNS, FinishedJob, format_table, hidden_in_backward, table_rows

PNG = b"\x89PNG"


def test_table_rows_give_speed_up_against_the_slowest_job():
    slow = FinishedJob("a", "slow", "gather_scatter", 4, {"mean_throughput_samples_per_s": 100.0, "sync_share": 0.5,
                                                   "mean_step_time_s": 0.4, "mean_sync_time_s": 0.2, "final_loss": 1.0})
    fast = FinishedJob("b", "fast", "allreduce", 4, {"mean_throughput_samples_per_s": 250.0, "sync_share": 0.2,
                                              "mean_step_time_s": 0.16, "mean_sync_time_s": 0.032, "final_loss": 1.0})
    fast.metrics["memory/total_bytes"] = 3 * 2**20
    rows = table_rows([slow, fast])
    assert [r["speed-up"] for r in rows] == [1.0, 2.5]
    assert [r["mem_MiB"] for r in rows] == [None, 3.0]  # a job before memory was measured shows none
    assert rows[0]["sync_%"] == 50.0
    lines = format_table(rows).splitlines()
    assert lines[0].split() == list(COLUMNS) and len(lines) == 4



def test_table_uses_the_step_times_that_leave_out_warm_up_when_a_job_has_them():
    metrics = {"mean_throughput_samples_per_s": 100.0, "mean_step_time_s": 0.4, "mean_sync_time_s": 0.2,
               "steady_throughput_samples_per_s": 200.0, "steady_mean_step_time_s": 0.2,
               "steady_mean_sync_time_s": 0.05}
    old = FinishedJob("b", "old", "allreduce", 4, {"mean_throughput_samples_per_s": 100.0, "mean_step_time_s": 0.4,
                                          "mean_sync_time_s": 0.1})
    new, before = table_rows([FinishedJob("a", "new", "allreduce", 4, metrics), old])
    assert (new["step_s"], new["sync_s"], new["sync_%"], new["samples/s"]) == (0.2, 0.05, 25.0, 200.0)
    assert (before["step_s"], before["sync_%"], before["speed-up"], new["speed-up"]) == (0.4, 25.0, 1.0, 2.0)

@pytest.mark.e2e
def test_compare_prints_the_table_writes_plots_and_logs_a_comparison_run(mlflow_server, tracked_jobs, tmp_path):
    out = tmp_path / "plots"
    result = subprocess.run(
        [sys.executable, "-m", "mpi_train", "compare", "--experiment", "tests-compare", "--tracking-uri", mlflow_server,
         "--out", str(out), "--log-artifacts"],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Jobs of 'tests-compare' (2 finished). Times per step: summary/<phase> = the mean")
    assert lines[1].split() == list(COLUMNS)
    rows = {line.split()[1]: line.split() for line in lines[3:5]}
    assert set(rows) == {"allreduce", "gather_scatter"}
    for sync, cells in rows.items():
        assert cells[2] == "2"  # world size
        assert cells[8] == f"{tracked_jobs[sync]['final_loss']:.4f}"
        assert float(cells[6]) == pytest.approx(tracked_jobs[sync]["memory"]["most"]["total_bytes"] / 2**20, abs=0.05)
    assert min(float(cells[-1]) for cells in rows.values()) == 1.0  # the slowest job is the baseline
    for name in ("loss_vs_step.png", "time_breakdown.png", "rank_step_time_spread.png", "accuracy_vs_time.png"):
        assert (out / name).read_bytes().startswith(PNG)
    # time to accuracy: gather_scatter was scored at steps 4 and 8, allreduce at its end (8) only
    section = result.stdout.split("Time to accuracy:")[1].split("\n\n")[0]
    table = {line.split()[1]: line.split() for line in section.splitlines()[3:5]}
    finals = {sync: job["evaluations"][-1]["test_accuracy"] for sync, job in tracked_jobs.items()}
    assert f"at or above {100 * (max(finals.values()) - 0.02):.2f}% (the best final accuracy minus 2 points)" in section
    assert set(table) == {"allreduce", "gather_scatter"} and table["allreduce"][3] == "8"
    assert table["gather_scatter"][3] in ("4", "8")
    assert [e["step"] for e in tracked_jobs["gather_scatter"]["evaluations"]] == [4, 8]
    # scoring at step 4 changed nothing in training: the same losses as allreduce's (the same update), unscored
    assert losses(tracked_jobs["gather_scatter"]) == pytest.approx(losses(tracked_jobs["allreduce"]), rel=1e-5)

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment_id = client.get_experiment_by_name("tests-compare").experiment_id
    (comparison,) = client.search_runs([experiment_id], "tags.`mpi_train.role` = 'comparison'")
    logged = {a.path for a in client.list_artifacts(comparison.info.run_id, "comparison")}
    assert {"comparison/table.txt", "comparison/loss_vs_step.png"} <= logged


def test_every_ddp_variant_is_reported_as_communicating_inside_backward():
    # Their sync call does nothing: a sync time of 0 held against a prediction would be a meaningless error.
    assert [hidden_in_backward(name) for name in ("ddp", "ddp_fp16", "ddp_powersgd")] == [True, True, True]
    assert [hidden_in_backward(name) for name in ("bucketed", "allreduce", "hierarchical", "unknown")] == [False] * 4
