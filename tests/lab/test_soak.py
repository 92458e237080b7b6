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
from mpi_train.lab import soak
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
