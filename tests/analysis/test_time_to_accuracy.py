"""Time to accuracy: the first evaluation at or above the target, the default target, the table against ddp."""

import pytest

from mpi_train.analysis import predict, time_to_accuracy
from mpi_train.analysis.compare_plots import plot
from mpi_train.analysis.finished_jobs import job_from_summary
from mpi_train.analysis.time_to_accuracy import Evaluation


def curve(*points):
    return [Evaluation(step, accuracy, elapsed, sent) for step, accuracy, elapsed, sent in points]


DDP = curve((40, 0.30, 200.0, 600.0), (80, 0.52, 400.0, 1200.0), (120, 0.61, 600.0, 1800.0))
LOCAL = curve((40, 0.28, 90.0, 80.0), (80, 0.55, 180.0, 160.0), (120, 0.60, 270.0, 240.0))
SLOW = curve((40, 0.20, 50.0, 1.0), (120, 0.45, 150.0, 3.0))


def test_a_run_reaches_the_target_at_its_first_evaluation_at_or_above_it():
    assert time_to_accuracy.reached(LOCAL, 0.55).step == 80
    assert time_to_accuracy.reached(list(reversed(LOCAL)), 0.5).step == 80  # in step order, whatever the input's
    assert time_to_accuracy.reached(SLOW, 0.5) is None


def test_the_default_target_is_the_best_final_accuracy_minus_two_points():
    assert time_to_accuracy.default_target([DDP, LOCAL, SLOW]) == pytest.approx(0.59)
    assert time_to_accuracy.default_target([[], []]) is None


def test_the_table_gives_steps_time_and_bytes_and_the_time_against_ddp():
    rows = time_to_accuracy.rows([("a", "ddp", DDP), ("b", "localsgd", LOCAL), ("c", "diloco", SLOW)], 0.5)
    by_sync = {row["sync"]: row for row in rows}
    assert (by_sync["ddp"]["steps"], by_sync["ddp"]["time_s"], by_sync["ddp"]["sent_mb"]) == (80, 400.0, 1200.0)
    assert by_sync["localsgd"]["time_vs"] == pytest.approx(180 / 400) and by_sync["localsgd"]["reference"] == "ddp"
    assert by_sync["diloco"]["steps"] is None and by_sync["diloco"]["time_vs"] is None
    text = time_to_accuracy.describe(rows, given=True)
    assert "at or above 50.00% (as given)" in text and "not reached" in text and "0.45x" in text
    # without ddp among them, the slowest run to reach the target is the reference
    without = time_to_accuracy.rows([("b", "localsgd", LOCAL), ("c", "flat", DDP)], 0.5)
    assert [row["time_vs"] for row in without] == [pytest.approx(180 / 400), 1.0]


def test_a_summary_file_carries_its_evaluations_and_drift_to_the_comparison_and_its_plots(tmp_path):
    summary = {"config": {"sync": "localsgd", "compression": "none", "batch_size": 64, "model": "mnist_cnn"},
               "world_size": 2, "total_steps": 8, "wall_time_s": 3.0, "final_loss": 1.0, "epochs": [],
               "steps": [{"step": 4, "loss": 1.5, "drift": 0.2}, {"step": 8, "loss": 1.0, "drift": 0.3}],
               "per_rank_mean_times": [{"step_time_s": 0.1}],
               "mean_times": {"step_time_s": 0.1, "sync_time_s": 0.01},
               "evaluations": [{"step": 4, "test_accuracy": 0.5, "test_loss": 1.2, "elapsed_s": 1.0, "sent_mb": 2.0}]}
    job = job_from_summary("run", summary)
    assert job.evaluations == [Evaluation(4, 0.5, 1.0, 2.0, 1.2)] and job.drift_curve == [(4, 0.2), (8, 0.3)]
    written = {path.name for path in plot([job], tmp_path)}
    assert {"accuracy_vs_time.png", "drift_vs_step.png"} <= written


def test_predict_carries_steps_to_accuracy_to_another_network(capsys):
    assert predict.main(["--model", "mnist_cnn", "--ranks", "4", "--ranks-per-host", "2", "--link", "10mbit",
                         "--compute-per-sample", "0.001", "--methods", "ddp,localsgd+fp16", "--period", "4",
                         "--steps-to-accuracy", "ddp=100,localsgd+fp16=120"]) == 0
    out = capsys.readouterr().out
    steps = {line.split()[0]: float(line.split()[4]) for line in out.splitlines()
             if line.split()[:1] in (["ddp"], ["localsgd+fp16"]) and len(line.split()) == 6}
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in out.splitlines()
            if line.split()[:1] in (["ddp"], ["localsgd+fp16"]) and len(line.split()) == 4}
    assert set(steps) == {"ddp", "localsgd+fp16"} and set(rows) == {"ddp", "localsgd+fp16"}
    for name, count in (("ddp", 100), ("localsgd+fp16", 120)):
        assert rows[name][2] == pytest.approx(count * rows[name][1] / 1e3, rel=1e-3)  # steps x step
    assert predict.main(["--model", "mnist_cnn", "--ranks", "4", "--link", "1gbit", "--compute-per-sample", "0.001",
                         "--steps-to-accuracy", "ring=0"]) == 2
    assert "must be METHOD=STEPS" in " ".join(capsys.readouterr().err.split())


def test_steps_to_accuracy_carry_to_every_link_a_configuration_was_timed_on():
    # allreduce evaluated on an unshaped link reaches 50% at step 80; ddp and allreduce timed on a slow one: every
    # lossless method computes the same update, so both take those 80 steps there
    evaluated = [(("lossless", 4), DDP), (("localsgd", "8", 4), LOCAL)]
    timed = [(("lossless", 4), {"run": "d", "sync": "ddp", "link": "10mbit", "step_s": 40.0}),
             (("localsgd", "8", 4), {"run": "l", "sync": "localsgd", "link": "10mbit", "step_s": 3.0}),
             (("diloco", "8", 4), {"run": "x", "sync": "diloco", "link": "10mbit", "step_s": 2.0})]  # never evaluated
    rows = time_to_accuracy.carried(evaluated, timed, 0.5)
    assert [(row["sync"], row["steps"], row["time_s"]) for row in rows] == [("ddp", 80, 3200.0),
                                                                            ("localsgd", 80, 240.0)]
    text = time_to_accuracy.describe_carried(rows, 0.5)
    assert "0.07x" in text and text.index("localsgd") < text.index("ddp   ")


def test_the_comparison_carries_the_evaluated_steps_to_runs_timed_on_other_links_even_when_those_were_scored_too():
    from mpi_train.analysis.accuracy_race import carried_to_links
    from mpi_train.analysis.finished_jobs import FinishedJob

    def job(name, sync, link, step_s, evaluations):
        averaging = {"period": "8"} if sync == "localsgd" else {}
        return FinishedJob(name, name, sync, 4, {"summary/step_s": step_s},
                           params={"link": link, "batch_size": "256", **averaging}, evaluations=evaluations)

    short = curve((16, 0.10, 30.0, 9.0))  # a timing run's own end-of-run score, far from the target
    jobs = [job("a", "allreduce", "unlimited", 4.0, DDP), job("l", "localsgd", "unlimited", 3.0, LOCAL),
            job("d", "ddp", "100mbit", 7.0, short), job("m", "localsgd", "100mbit", 2.5, short)]
    rows = {row["run"]: row for row in carried_to_links(jobs, 0.5)}
    assert (rows["d"]["steps"], rows["d"]["time_s"]) == (80, 560.0)  # allreduce's steps: the same update as ddp's
    assert (rows["m"]["steps"], rows["m"]["time_s"]) == (80, 200.0)
    assert carried_to_links(jobs[:2], 0.5) == []  # nothing timed elsewhere: nothing to carry


def losses(*points):
    return [Evaluation(step, 0.3, elapsed, sent, loss) for step, loss, elapsed, sent in points]


# validation losses in nats per byte, as a gpt's evaluations log them
GPT_DDP = losses((50, 2.90, 60.0, 300.0), (100, 2.40, 120.0, 600.0), (150, 1.95, 180.0, 900.0))
GPT_LOCAL = losses((50, 3.00, 30.0, 40.0), (100, 2.45, 60.0, 80.0), (150, 2.10, 90.0, 120.0))


def test_a_language_model_races_to_the_first_validation_loss_at_or_below_the_target():
    target = time_to_accuracy.Target(2.0, time_to_accuracy.LOSS)
    assert time_to_accuracy.reached(GPT_DDP, target).step == 150
    assert time_to_accuracy.reached(GPT_LOCAL, target) is None
    assert time_to_accuracy.reached(GPT_LOCAL, time_to_accuracy.Target(2.45, time_to_accuracy.LOSS)).step == 100
    # the default: the lowest final validation loss plus 0.05 nats
    assert time_to_accuracy.default_target([GPT_DDP, GPT_LOCAL], kind=time_to_accuracy.LOSS) == pytest.approx(2.0)
    rows = time_to_accuracy.rows([("a", "ddp", GPT_DDP), ("b", "localsgd", GPT_LOCAL)],
                                 time_to_accuracy.Target(2.45, time_to_accuracy.LOSS))
    by_sync = {row["sync"]: row for row in rows}
    assert (by_sync["ddp"]["steps"], by_sync["ddp"]["time_s"], by_sync["localsgd"]["time_s"]) == (100, 120.0, 60.0)
    assert by_sync["localsgd"]["time_vs"] == pytest.approx(0.5) and by_sync["ddp"]["final_accuracy"] == 1.95
    text = time_to_accuracy.describe(rows, given=True)
    assert "Time to validation loss" in text and "at or below 2.450 nats (a mean cross-entropy" in text
    assert "(as given)" in text
    assert "1.950" in text and "2.100" in text and "%" not in text.splitlines()[2]


def test_a_comparison_of_gpt_jobs_races_to_a_validation_loss_unless_told_otherwise(tmp_path):
    from mpi_train.analysis.accuracy_race import race_target
    from mpi_train.analysis.compare import comparison
    from mpi_train.errors import UserError

    def summary(sync, evaluations):
        return {"config": {"sync": sync, "compression": "none", "batch_size": 64, "model": "gpt"},
                "world_size": 4, "total_steps": 150, "wall_time_s": 200.0, "final_loss": 1.9, "epochs": [],
                "steps": [{"step": 150, "loss": 1.9}], "per_rank_mean_times": [{"step_time_s": 1.0}],
                "mean_times": {"step_time_s": 1.0, "sync_time_s": 0.2},
                "evaluations": [{"step": e.step, "test_accuracy": e.accuracy, "test_loss": e.loss,
                                 "elapsed_s": e.elapsed_s, "sent_mb": e.sent_mb} for e in evaluations]}

    jobs = [job_from_summary("ddp-run", summary("ddp", GPT_DDP)), job_from_summary("local", summary("localsgd",
                                                                                                  GPT_LOCAL))]
    assert race_target(jobs) == time_to_accuracy.Target(pytest.approx(2.0), time_to_accuracy.LOSS)
    assert race_target(jobs, target_accuracy=0.3).kind == time_to_accuracy.ACCURACY
    text = comparison(jobs, "gpt", target_loss=2.45)
    assert "Time to validation loss" in text and "at or below 2.450 nats (a mean cross-entropy" in text
    assert "(as given)" in text
    with pytest.raises(UserError, match="both a target accuracy"):
        race_target(jobs, 0.3, 2.0)
    with pytest.raises(UserError, match=r"^--target-accuracy 60 is not a fraction in \(0, 1\] \(did you mean 0\.6\?\)"):
        race_target(jobs, 60)
    with pytest.raises(UserError, match="^--target-loss -1 is no validation loss"):
        race_target(jobs, target_loss=-1)
    with pytest.raises(UserError, match="^--target-loss inf is no validation loss"):  # every run once reached it
        race_target(jobs, target_loss=float("inf"))
    assert "validation_loss_vs_time.png" in {path.name for path in plot(jobs, tmp_path)}
