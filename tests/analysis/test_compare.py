"""`python -m mpi_train compare` over real tracked jobs: the table, the plots, the comparison run."""

import shutil
import subprocess
import sys

import pytest
from conftest import REPO, losses

from mpi_train.analysis.compare import (
    COLUMNS,
    format_prediction_table,
    format_table,
    hidden_in_backward,
    main,
    prediction_rows,
    runs_table,
    speed_up_header,
    speed_up_reference,
    table_rows,
)
from mpi_train.analysis.finished_jobs import FinishedJob, job_from_summary, load_jobs
from mpi_train.analysis.noise import WITHIN_NOISE

PNG = b"\x89PNG"


def test_table_rows_give_speed_up_against_the_slowest_job_without_allreduce():
    slow = FinishedJob(run_id="a", name="slow", sync="gather_scatter", world_size=4,
                       metrics={"mean_throughput_samples_per_s": 100.0, "sync_share": 0.5, "mean_step_time_s": 0.4,
                                "mean_sync_time_s": 0.2, "final_loss": 1.0})
    fast = FinishedJob(run_id="b", name="fast", sync="ring", world_size=4,
                       metrics={"mean_throughput_samples_per_s": 250.0, "sync_share": 0.2, "mean_step_time_s": 0.16,
                                "mean_sync_time_s": 0.032, "final_loss": 1.0})
    fast.metrics["memory/total_bytes"] = 3 * 2**20
    rows = table_rows([slow, fast])
    assert [r["speed-up"] for r in rows] == [1.0, 2.5]
    assert [r["mem_MiB/rank"] for r in rows] == [None, 3.0]  # a job before memory was measured shows none
    assert rows[0]["sync_%_of_step"] == 50.0 and rows[1]["step_ms"] == 160.0
    assert speed_up_header(speed_up_reference([slow, fast])) == "speed-up_vs_slowest"
    lines = format_table(rows).splitlines()
    assert lines[0].split() == list(COLUMNS) and len(lines) == 4
    ddp = FinishedJob(run_id="c", name="ddp", sync="ddp", world_size=4,
                      metrics={"mean_throughput_samples_per_s": 200.0, "mean_step_time_s": 0.2,
                               "mean_sync_time_s": 0.0})
    (row,) = table_rows([ddp])  # once 0.0 ms: ddp's communication read as free
    assert row["sync_ms"] == row["sync_%_of_step"] == "in compute"


def test_a_long_run_name_is_cut_in_its_middle_not_the_table_widened():
    """--run-name takes 500 characters; such a name once made every table of compare 500 characters wide."""
    def job(name):
        return FinishedJob(run_id=name, name=name, sync="ring", world_size=2,
                           metrics={"summary/step_s": 0.1, "summary/sync_s": 0.01, "summary/samples_per_s": 320.0})

    long_a, long_b = "sweep-" + "x" * 480 + "-lr0.1", "sweep-" + "x" * 480 + "-lr0.2"
    lines = format_table(table_rows([job(long_a), job(long_b), job("short")])).splitlines()
    assert max(map(len, lines)) < 200 and lines[2].startswith("sweep-xxx") and "…" in lines[2]
    assert lines[2].split()[0].endswith("-lr0.1") and lines[3].split()[0].endswith("-lr0.2")  # still told apart
    assert lines[4].split()[0] == "short"


def test_speed_up_is_against_ddp_at_its_smallest_world_size_and_says_so():
    def job(name, sync, np, step_s):
        return FinishedJob(run_id=name, name=name, sync=sync, world_size=np,
                           metrics={"summary/step_s": step_s, "summary/sync_s": step_s / 4,
                                    "summary/samples_per_s": 64 / step_s})

    jobs = [job("ddp-np4", "ddp", 4, 0.1), job("ddp-np2", "ddp", 2, 0.2), job("ring-np4", "ring", 4, 0.05)]
    reference = speed_up_reference(jobs)
    assert reference.name == "ddp-np2"
    text = runs_table(jobs)
    assert text.splitlines()[0].split()[-1] == "speed-up_vs_ddp_np2"
    assert "samples/s over run ddp-np2's" in text and "within noise = " in text
    assert [r["speed-up"] for r in table_rows(jobs)] == [pytest.approx(2.0), 1.0, pytest.approx(4.0)]


def test_each_column_has_one_format_and_its_unit_in_its_header():
    """A value of 34.5 and one of 0.0097 in one column print with the same decimals: the width of the number says
    nothing about its size."""
    def job(name, step_s, sync_s, held, accuracy):
        return FinishedJob(run_id=name, name=name, sync="ring", world_size=2,
                           metrics={"summary/step_s": step_s, "summary/sync_s": sync_s,
                                    "summary/samples_per_s": 32 / step_s, "summary/final_loss": 2.3,
                                    "summary/test_accuracy": accuracy, "memory/total_bytes": held})

    jobs = [job("a", 0.0787, 0.0272, 13.7 * 2**20, 0.125), job("b", 0.0623, 0.000006, 7.2 * 2**20, 0.0625),
            job("c", 12.5, 0.5, 120.25 * 2**20, 0.9)]
    lines = format_table(table_rows(jobs)).splitlines()
    header, rows = lines[0].split(), [line.split() for line in lines[2:]]
    assert header[3:10] == ["step_ms", "sync_ms", "sync_%_of_step", "mem_MiB/rank", "samples/s", "final_loss",
                            "test_acc_%"]
    for column in range(3, 10):
        decimals = {len(row[column].split(".")[1]) for row in rows}
        assert len(decimals) == 1, (header[column], [row[column] for row in rows])
    assert [row[5] for row in rows] == ["34.6", "0.0", "4.0"]  # sync % of step: 0.0096 shows as 0.0, not 0.0096
    assert [row[3] for row in rows] == ["78.7", "62.3", "12500.0"] and rows[0][9] == "12.50"


def test_a_step_time_within_noise_gives_no_speed_up_and_a_real_difference_still_does():
    def job(name, sync, step_s, windows):
        found = FinishedJob(run_id=name, name=name, sync=sync, world_size=2,
                            metrics={"summary/step_s": step_s, "summary/samples_per_s": 32 / step_s})
        found.step_times = windows
        return found

    reference = job("ddp", "ddp", 0.080, [0.079, 0.081, 0.080])
    close = job("bucketed", "bucketed", 0.0835, [0.083, 0.084, 0.0835])  # 3.5 ms apart: under the 5 ms floor
    jittery = job("ring", "ring", 0.095, [0.070, 0.120, 0.095])  # 15 ms apart, but its steps stray by 25 ms
    faster = job("diloco", "diloco", 0.060, [0.059, 0.061, 0.060])  # 20 ms apart, steps within 1 ms
    rows = {row["run"]: row["speed-up"] for row in table_rows([reference, close, jittery, faster])}
    assert rows["bucketed"] == WITHIN_NOISE and rows["ring"] == WITHIN_NOISE
    assert rows["diloco"] == pytest.approx(0.080 / 0.060) and rows["ddp"] == 1.0
    assert WITHIN_NOISE in format_table(table_rows([reference, close]))


def test_a_prediction_within_noise_gives_no_error_and_a_real_miss_does():
    def job(sync, measured, predicted, fit):
        found = FinishedJob(run_id=sync, name=sync, sync=sync, world_size=2,
                            metrics={"summary/sync_s": measured, "summary/predicted_sync_s": predicted,
                                     "summary/prediction_fit_error": fit},
                            params={"model": "mnist_cnn", "num_hosts": "1"}, step_times=[0.080, 0.081, 0.079])
        return found

    rows = {row["sync"]: row for row in prediction_rows([job("bucketed", 0.0014, 0.0010, 0.56),
                                                         job("flat", 0.0157, 0.0022, 0.56)])}
    assert rows["bucketed"]["noisy"] and rows["bucketed"]["error"] is None
    assert not rows["flat"]["noisy"] and rows["flat"]["error"] == pytest.approx(0.0022 / 0.0157 - 1)
    table = format_prediction_table(list(rows.values()))
    assert WITHIN_NOISE in table and "-86%" in table and table.count("56%") == 2


def test_a_job_s_summary_carries_its_model_s_fit_error_into_the_prediction_table():
    times = {"data_time_s": 0.0, "compute_time_s": 0.05, "sync_time_s": 0.0157, "optimizer_time_s": 0.0,
             "step_time_s": 0.0802}
    summary = {"config": {"batch_size": 32, "sync": "flat", "model": "mnist_cnn"}, "world_size": 2, "total_steps": 4,
               "wall_time_s": 3.0, "final_loss": 2.3, "timing_warmup_steps": 1, "mean_times": times,
               "mean_times_after_warmup": times, "per_rank_mean_times": [times, times],
               "steps": [{"step": step, "loss": 2.3, "step_time_s": seconds}
                         for step, seconds in ((1, 0.6), (2, 0.080), (3, 0.081), (4, 0.079))],
               "predicted_sync_time_s": 0.0022, "prediction_fit_error": 0.56}
    job = job_from_summary("flat-np2", summary)
    assert job.step_times == [0.080, 0.081, 0.079]  # step 1, the warm-up, left out of the spread
    (row,) = prediction_rows([job])
    assert row["fit_error"] == 0.56 and row["error"] == pytest.approx(0.0022 / 0.0157 - 1)


@pytest.mark.e2e
def test_compare_prints_the_table_writes_plots_and_logs_a_comparison_run(mlflow_server, tracked_jobs, tmp_path):
    from mpi_train.tracking import mlflow_client

    client = mlflow_client(mlflow_server)
    experiment_id = client.get_experiment_by_name("tests-compare").experiment_id
    job = client.search_runs([experiment_id], filter_string="tags.`mpi_train.role` = 'job'")[0]
    # a run the user nested under a job with MLflow of their own: once drawn as an extra rank 0 at 0 ms
    nested = client.create_run(experiment_id, tags={"mlflow.parentRunId": job.info.run_id}, run_name="my-score")
    client.log_metric(nested.info.run_id, "my_score", 1.0)
    client.set_terminated(nested.info.run_id)
    try:
        assert all(len(one.rank_step_times) == one.world_size == 2 for one in load_jobs(client, experiment_id))
    finally:
        client.delete_run(nested.info.run_id)  # the other tests of the shared store read the job's ranks
    out = tmp_path / "plots"
    failed = client.create_run(experiment_id, tags={"mpi_train.role": "job"}, run_name="failed").info.run_id
    client.set_terminated(failed, "FAILED")  # a job whose figures are not whole: counted, not compared
    try:
        result = subprocess.run(
            [sys.executable, "-m", "mpi_train", "compare", "--experiment", "tests-compare", "--tracking-uri",
             mlflow_server, "--out", str(out), "--log-artifacts"],
            capture_output=True, text=True, timeout=120, cwd=REPO,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=False,
        )
    finally:
        client.delete_run(failed)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\nLeft out: 1 FAILED job(s), whose figures are not whole.\n" in result.stdout
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Jobs of 'tests-compare' (2 finished). Times per step: summary/<phase> = the mean")
    assert lines[1].split()[:-1] == list(COLUMNS[:-1]) and lines[1].split()[-1] == "speed-up_vs_slowest"
    rows = {line.split()[1]: line.split() for line in lines[3:5]}
    assert set(rows) == {"allreduce", "gather_scatter"}
    for sync, cells in rows.items():
        assert cells[2] == "2"  # world size
        assert cells[8] == f"{tracked_jobs[sync]['final_loss']:.4f}"
        assert float(cells[6]) == pytest.approx(tracked_jobs[sync]["memory"]["most"]["total_bytes"] / 2**20, abs=0.05)
    speed_ups = sorted(cells[-1] for cells in rows.values())  # no ddp: the slowest is the baseline
    assert speed_ups[0] == "1.00x" and (speed_ups[1] == WITHIN_NOISE or float(speed_ups[1].rstrip("x")) > 1)
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


def test_a_store_that_is_not_there_is_named_and_not_created(tmp_path, capsys):
    store = tmp_path / "typo" / "mlflow.db"
    assert main(["--experiment", "x", "--tracking-uri", f"sqlite:///{store}", "--out", str(tmp_path / "out")]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"There is no tracking store at {store} (sqlite:///{store}): no job has recorded there." in error
    assert not (tmp_path / "typo").exists() and not (tmp_path / "out").exists()


def test_an_experiment_of_unfinished_jobs_is_told_by_what_it_holds(tmp_path, capsys):
    from mpi_train.tracking.store import mlflow_client

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow_client(uri)
    experiment = client.create_experiment("broken", artifact_location=str(tmp_path / "artifacts"))
    for status in ("FAILED", "FAILED", "RUNNING"):
        run = client.create_run(experiment, tags={"mpi_train.role": "job"}).info.run_id
        if status != "RUNNING":
            client.set_terminated(run, status)
    assert main(["--experiment", "broken", "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "has no FINISHED jobs to compare (its jobs: 2 FAILED, 1 RUNNING; compare reads the FINISHED ones" in error


def test_jobs_of_several_workloads_are_said_to_compare_within_one_and_stale_plots_go(tmp_path):
    from mpi_train.analysis.compare import mixed_workloads
    from mpi_train.analysis.compare_plots import remove_stale

    def job(name, model, dataset):
        return FinishedJob(run_id=name, name=name, sync="ddp", world_size=2, metrics={},
                           params={"model": model, "dataset": dataset})

    same = [job("a", "mnist_cnn", "synthetic"), job("b", "mnist_cnn", "synthetic")]
    assert mixed_workloads(same) is None
    said = mixed_workloads([*same, job("c", "resnet18", "imagefolder")])
    assert said.startswith("warning: these jobs train 2 workloads: mnist_cnn on synthetic (2 jobs), resnet18 on "
                           "imagefolder (1 job). Their step times and speed-ups compare within one workload only")
    # each workload races to a target of its own: once the GPT's next-byte accuracy raced the CNN's to one target
    from mpi_train.analysis.compare import comparison
    from mpi_train.analysis.compare_plots import plot
    from mpi_train.analysis.time_to_accuracy import Evaluation

    raced = [job("cnn", "mnist_cnn", "mnist"), job("gpt", "gpt", "text")]
    raced[0].evaluations = [Evaluation(10, 0.50, 1.0, 1.0), Evaluation(20, 0.95, 2.0, 2.0)]
    raced[1].evaluations = [Evaluation(10, 0.30, 1.0, 1.0, 2.6), Evaluation(20, 0.40, 2.0, 2.0, 2.2)]
    text = " ".join(comparison(raced, "Jobs").split())
    assert "mnist_cnn on mnist: Time to accuracy: " in text and "at or above 93.00%" in text
    assert "gpt on text: Time to validation loss: " in text and "at or below 2.250 nats" in text
    plots = tmp_path / "plots"
    drawn = sorted(path.name for path in plot(raced, plots) if "_vs_time" in path.name)
    assert drawn == ["accuracy_vs_time-mnist_cnn_on_mnist.png", "validation_loss_vs_time-gpt_on_text.png"]
    remove_stale(plots, plot(raced[:1], plots))  # one workload: its race under the plain name, the two above stale
    assert sorted(path.name for path in plots.glob("*_vs_time*")) == ["accuracy_vs_time.png"]
    shutil.rmtree(plots)
    # one run name given to jobs of two workloads, and a rerun: each row named apart
    from mpi_train.analysis.finished_jobs import distinct_names
    jobs = [job("a", "mnist_cnn", "synthetic"), job("a", "resnet18", "imagefolder"), job("b", "mnist_cnn", "synthetic")]
    jobs[1].run_id, jobs[2].run_id, jobs[2].name = "9f2c61d0aa", "31b07e44cc", "a"
    assert [one.name for one in distinct_names(jobs)] == ["a [mnist_cnn on synthetic] [a]",
                                                         "a [resnet18 on imagefolder]",
                                                         "a [mnist_cnn on synthetic] [31b07e44]"]
    # in the plots too, where a label (method and ranks) two jobs share would be one legend entry and one bar
    from mpi_train.analysis.compare_plots import shown_as
    jobs[2].world_size = 4
    assert shown_as(jobs) == ["a [mnist_cnn on synthetic] [a]", "a [resnet18 on imagefolder]", "ddp np4"]
    for name in ("loss_vs_step.png", "validation_loss_vs_time.png", "mine.png"):
        (tmp_path / name).write_bytes(PNG)
    remove_stale(tmp_path, [tmp_path / "loss_vs_step.png"])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["loss_vs_step.png", "mine.png"]
