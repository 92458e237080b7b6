"""The fault soak and the restart soak: how a trial is judged, drawn and printed, and the command on test hosts.

The soaks' 30-trial runs are commands with their tables in docs/results.md, not tests. The
end-to-end test here runs one trial of the fault soak to show the command works from a fresh
clone as root; the test hosts, the server and the finding of a job's processes are the two
soaks' shared parts (lab/soakparts.py). What the restart soak checks has end-to-end tests of
its own: the supervisor (tests/lab/test_supervise.py), a host gone for good
(tests/test_network_faults.py), exact resumes (tests/test_checkpoint.py).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys

import pytest
from conftest import REPO, why_no_namespaces

from mpi_train.errors import UserError
from mpi_train.lab import restart_soak, soak
from mpi_train.lab.restart_soak import SLACK_S, RestartTrial
from mpi_train.lab.soak import Trial


def args(**changes) -> argparse.Namespace:
    return soak.build_parser().parse_args([f"--{k.replace('_', '-')}={v}" for k, v in changes.items()])


def test_a_trial_is_ok_only_when_the_job_ended_as_its_fault_demands():
    killed = Trial(1, "kill", "rank 3", 5, end_s=0.7, exit=137, run_status="FAILED", logged=5, printed=5)
    assert killed.verdict(15) == "ok"
    assert Trial(1, "kill", "rank 3", 5, end_s=31.0, exit=1, run_status="FAILED", logged=5,
                 printed=5).verdict(15) == "LATE"
    assert Trial(1, "stop", "rank 0", 5, end_s=15.4, exit=0, run_status="FAILED", logged=5,
                 printed=5).verdict(15) == "NOT FAILED"
    assert Trial(1, "link", "host soak2", 5, exit=None, run_status="RUNNING", logged=4, printed=5,
                 left=3).verdict(15) == "HANG, RUN RUNNING, LOST METRICS, LEFT BEHIND"
    outage = Trial(1, "server", "server", 5, end_s=9.0, exit=0, run_status="FINISHED", logged=12, printed=12)
    assert outage.verdict(15) == "ok"
    assert Trial(1, "server", "server", 5, end_s=9.0, exit=0, run_status="RUNNING", logged=7,
                 printed=12).verdict(15) == "RUN RUNNING, LOST METRICS"


def test_the_draws_follow_the_seed_and_stay_inside_the_job():
    chosen = args(hosts=3, ranks_per_host=2, steps=10)
    first = [soak.draw(i, random.Random(7), list(soak.FAULTS), chosen) for i in range(1, 6)]
    again = [soak.draw(i, random.Random(7), list(soak.FAULTS), chosen) for i in range(1, 6)]
    assert first == again
    rng = random.Random(1)
    for number in range(200):
        trial = soak.draw(number, rng, list(soak.FAULTS), chosen)
        assert 2 <= trial.step <= 7
        if trial.fault in ("kill", "stop"):
            assert 0 <= int(trial.target.split()[1]) < 6
        if trial.fault == "link":
            assert trial.target in ("host soak1", "host soak2", "host soak3")
    assert {soak.draw(i, rng, ["link"], chosen).fault for i in range(5)} == {"link"}


def test_bad_soak_options_are_refused_before_anything_starts():
    with pytest.raises(UserError, match="'kill,flood' names flood"):
        soak.validate(args(faults="kill,flood"))
    with pytest.raises(UserError, match="--hosts at least 2"):
        soak.validate(args(hosts=1))
    assert soak.validate(args(faults="kill, link")) == ["kill", "link"]
    # once refused by the script after test hosts came up, naming its variables and not the flag
    with pytest.raises(UserError, match=r"^--prefix: 'Lab1' must be 1 to 10 lower-case letters"):
        soak.validate(args(prefix="Lab1"))
    with pytest.raises(UserError, match=r"^--subnet: '999\.1\.1' must be the first three numbers"):
        soak.validate(args(subnet="999.1.1"))
    with pytest.raises(UserError, match=r"^--link: '1\.5gbit' is not a rate scripts/testhosts\.sh shapes"):
        soak.validate(args(link="1.5gbit"))


def test_an_out_that_is_a_file_is_refused_before_any_test_host_is_made(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert soak.main(["--out", str(tmp_path / "notes.txt"), "--trials", "1"]) == 2  # once a NotADirectoryError
    assert f"--out {tmp_path}/notes.txt is a file, not a folder" in " ".join(capsys.readouterr().err.split())
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_table_has_a_row_per_trial_and_totals_that_count_the_problems():
    trials = [Trial(1, "kill", "rank 1", 4, end_s=0.6, exit=137, run_status="FAILED", logged=4, printed=4),
              Trial(2, "link", "host soak2", 6, end_s=40.0, exit=1, run_status="FAILED", logged=6, printed=6, left=2)]
    table = soak.format_table(trials, 15)
    assert table.splitlines()[0].split() == list(soak.COLUMNS)
    assert "LATE, LEFT BEHIND" in table.splitlines()[3]
    assert soak.totals(trials, 15).startswith("2 trials, 1 ok; hangs past the bound: 1, lost metrics: 0 step(s), "
                                              "processes left: 2")


def test_a_restart_trial_is_ok_only_when_the_job_carried_on_as_if_never_stopped():
    fine = RestartTrial(1, "kill", "rank 2", 7, exit=0, attempts=2, last_step=20, weights_equal=True, parent_runs=1,
                        run_status="FINISHED", loss_steps="ok", lost_s=14.0, restart_s=9.0, interval_s=3.5)
    assert fine.verdict(20) == "ok"
    assert RestartTrial(1, "stop", "rank 0", 7, exit=1, last_step=9, parent_runs=2, run_status="FAILED",
                        loss_steps="missing [10]", lost_s=40.0, restart_s=None, left=2).verdict(20) == \
        "NOT FINISHED, LAST STEP 9, WEIGHTS DIFFER, RUNS 2 FAILED, LOSSES missing [10], SLOW, LEFT BEHIND"
    late = RestartTrial(**{**fine.__dict__, "lost_s": 9.0 + 3.5 + SLACK_S + 0.1})  # lost more than it had to
    assert late.verdict(20) == "SLOW"


def test_a_trial_that_changed_size_is_judged_by_its_final_loss_and_a_flap_by_its_grows():
    grown = RestartTrial(number=1, fault="return", target="host soak2", step=4, exit=0, attempts=3, last_step=20,
                         sizes="4>2>4", grows=1, loss_rel=2e-4, parent_runs=1, run_status="FINISHED", loss_steps="ok",
                         lost_s=30.0, restart_s=20.0, interval_s=3.5, failures=1, slower_s=5.0)
    assert grown.verdict(20) == "ok" and grown.ended_full  # weights differ: the sums ran over 2 ranks a while
    assert RestartTrial(**{**grown.__dict__, "loss_rel": 5e-3}).verdict(20) == "LOSS DIFFERS"
    assert RestartTrial(**{**grown.__dict__, "slower_s": 0.0}).verdict(20) == "SLOW"  # 30 s > 20 + 3.5 + 2
    stayed_small = RestartTrial(**{**grown.__dict__, "sizes": "4>2", "grows": 0})
    assert stayed_small.verdict(20) == "ok" and not stayed_small.ended_full
    assert RestartTrial(**{**grown.__dict__, "sizes": "4>4"}).verdict(20) == "WEIGHTS DIFFER"  # never resharded
    thrashed = RestartTrial(**{**grown.__dict__, "fault": "flap", "grows": 3, "failures": 3})
    assert thrashed.verdict(20) == "THRASHED (3 grows)"
    assert thrashed.bound_s == 20.0 + 3 * 3.5 + 5.0 + SLACK_S  # each failure may redo a checkpoint interval


def step(number: int, seconds: float) -> str:
    return (f"epoch 1 step {number:>5}/20  loss 2.3026  lr 0.1  step {seconds:.3f}s (compute 0.100s, sync "
            f"0.200s)  64 samples/s\n")


def test_the_output_tells_each_launch_its_size_its_grows_and_the_time_spent_relaunching():
    lines = [(0.0, "mpi_train: 4 rank(s) on 2 host(s) (10.92.0.2, 10.92.0.3), backend gloo\n"),
             (1.0, step(1, 1.0)), (2.0, step(2, 1.0)), (3.0, step(3, 1.0)),  # the link is cut at 3.0
             (20.0, "mpi_train supervise: attempt 1 failed (exit status 1); relaunching with --resume auto in 2 s\n"),
             (30.0, "mpi_train: 2 rank(s) on 1 host(s) (10.92.0.2), backend gloo\n"),
             (31.5, step(1, 1.5)), (33.0, step(2, 1.5)), (34.5, step(3, 1.5)),
             (35.0, ("mpi_train supervise: host(s) 10.92.0.3 ready: step 1.50 s on 2 ranks, about 0.75 s on 4; 16 "
                     "steps left save about 12 s against a relaunch of 1 s (assumed): growing.\n")),
             (36.0, step(4, 1.5)),
             (40.0, "mpi_train: 4 rank(s) on 2 host(s) (10.92.0.2, 10.92.0.3), backend gloo\n"),  # fails at start
             (50.0, "mpi_train: 4 rank(s) on 2 host(s) (10.92.0.2, 10.92.0.3), backend gloo\n"),
             (55.0, step(5, 1.0)), (56.2, step(6, 1.2)),
             (57.0, ("mpi_train supervise: Host(s) 10.92.0.3 returned ready: ... (measured): not growing. (3 slots "
                    "offered, 2 ranks used: as many as split the global batch of 64)\n"))]
    assert [(ranks, len(steps)) for ranks, steps in restart_soak.launches(lines)] == [(4, 3), (2, 4), (4, 0), (4, 2)]
    # fault to the first relaunched step, then the last step before the grow's launches to their first, less a step
    assert restart_soak.restart_time(lines, 3.0, 1.0) == (31.5 - 3.0 - 1.0) + (55.0 - 36.0 - 1.0)
    assert restart_soak.restart_time(lines[:5], 3.0, 1.0) is None  # no relaunch trained
    assert restart_soak.slower_steps_s(lines, 1.0) == pytest.approx(3 * 0.5 + 0.2)  # first steps left out
    assert restart_soak.slower_steps_s(lines, 2.0) == 0.0  # faster than the reference: nothing lost there
    assert [bool(restart_soak.GROWING.search(text)) for _, text in lines].count(True) == 1


def test_a_returning_link_comes_up_after_the_shrink_and_a_flapping_one_ends_up():
    assert restart_soak.link_schedule("link") == [(restart_soak.LINK_DOWN_S, "up")]
    assert restart_soak.link_schedule("return") == [(restart_soak.RETURN_AFTER_S, "up")]
    flap = restart_soak.link_schedule("flap")
    assert [state for _, state in flap] == ["up"] + ["down", "up"] * restart_soak.FLAP_TIMES
    assert all(seconds == restart_soak.FLAP_S for seconds, _ in flap[1:])


def test_a_host_that_returns_is_cut_in_the_jobs_first_half_so_that_it_can_grow_back():
    chosen = args(hosts=3, ranks_per_host=1, steps=20)
    rng = random.Random(5)
    trials = [restart_soak.draw(i, rng, list(restart_soak.FAULTS), chosen) for i in range(300)]
    assert {t.fault for t in trials} == set(restart_soak.FAULTS)
    for trial in trials:
        assert 2 <= trial.step <= (10 if trial.fault in restart_soak.GROW_FAULTS else 17)
        if trial.fault in restart_soak.LINK_FAULTS:
            assert trial.target in ("host soak1", "host soak2", "host soak3")


def test_the_supervisor_line_is_one_the_supervisor_takes():
    from mpi_train.lab import supervise

    chosen = args(hosts=3, ranks_per_host=2)
    for fault, host_wait in (("link", restart_soak.HOST_WAIT_S), ("return", restart_soak.GROW_HOST_WAIT_S)):
        line = restart_soak.supervisor_line(chosen, fault)
        assert line[:4] == [sys.executable, "-m", "mpi_train", "supervise"]
        parsed = supervise.build_parser().parse_args([*line[4:], "--", "mpirun", "-np", "6", "python"])
        assert parsed.min_ranks == 4 and parsed.host_wait == host_wait  # one host's ranks fewer
        assert parsed.host_cooldown == restart_soak.HOST_COOLDOWN_S
        assert parsed.relaunch_cost == restart_soak.RELAUNCH_COST_S


@pytest.mark.e2e
def test_the_soak_command_runs_its_trial_and_cleans_up(tmp_path):
    """One trial of the fault soak, a rank killed: the test hosts, the MLflow server on their bridge, finding and
    ending the job's processes and the table, which the restart soak shares (its 30 trials: docs/results.md)."""
    reason = why_no_namespaces("soaktest")
    if reason:
        pytest.skip(reason)
    out = tmp_path / "soak"
    done = subprocess.run([sys.executable, "-m", "mpi_train", "soak", "--trials", "1", "--faults", "kill",
                           "--seed", "3", "--steps", "6", "--timeout", "10", "--link", "1gbit", "--out", str(out),
                           "--prefix", "soaktest", "--subnet", "10.85.0"],  # apart from a soak run by hand
                          capture_output=True, text=True, cwd=REPO, timeout=400, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads((out / "soak.json").read_text())
    assert row["verdict"] == "ok" and row["fault"] == "kill", done.stdout
    assert row["run_status"] in ("FAILED", "KILLED") and row["left"] == 0 and row["logged"] == row["printed"] >= 2
    assert "1 trials, 1 ok" in done.stdout
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    assert "soaktest" not in namespaces
