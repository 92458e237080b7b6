"""scripts/grow_check.py's reading of a supervised job's timed output: attempts, grow decisions, the targets."""

from __future__ import annotations

import importlib.util
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from mpi_train.errors import UserError

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "grow_check.py"


@pytest.fixture(scope="module")
def grow_check():
    spec = importlib.util.spec_from_file_location("grow_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["grow_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def step(number: int) -> str:
    return (f"epoch 1 step {number:5d}/120  loss 2.4139  lr 0.0005  step 0.543s (compute 0.408s, sync 0.093s: wait "
            f"0.008s)  88 samples/s (44/rank, data 0%, 40.3 GFLOP/s/rank)")


def banner(ranks: int) -> str:
    return (f"mpi_train: {ranks} rank(s) on {ranks} host(s) (grx1, grx2), backend gloo, sync allreduce, vgg11 on "
            f"synthetic, batch 24 (12 per rank)")


NEAR_END = ("mpi_train supervise: Host(s) 10.93.0.4 returned ready: step 0.41 s on 2 ranks, about 0.27 s on 3; 3 "
            "step(s) left, within 5 of the end: not growing.")
GROWING = ("mpi_train supervise: Host(s) 10.93.0.4 returned ready: step 0.41 s on 2 ranks, about 0.27 s on 3; 90 "
           "steps left save about 12 s against a relaunch of 9 s (measured): growing.")
# a job cut at step 7 (checkpoint 5), on 2 ranks from step 6, the link up at 40 s, grown at 52 s, on 3 ranks at 60 s
TRANSCRIPT = [(0.0, banner(3)), *((1.0 + s, step(s)) for s in range(1, 8)),
              (20.0, "mpi_train supervise: attempt 1 failed (exit status 1, latest checkpoint: step 5) after 19 s"),
              (25.0, banner(2)), (30.0, step(6)), (31.0, step(7)), (52.0, GROWING),
              (53.0, NEAR_END),
              (55.0, banner(3)), (60.0, step(26)), (61.0, step(27))]


def test_each_attempt_has_its_world_size_and_first_step(grow_check):
    attempts = grow_check.attempts_of(TRANSCRIPT)
    assert [(a.world, a.first_step, a.first_step_at) for a in attempts] == [(3, 1, 2.0), (2, 6, 30.0), (3, 26, 60.0)]
    assert grow_check.first_attempt_after(attempts, 8.0, 2).started_at == 25.0
    assert grow_check.first_attempt_after(attempts, 40.0, 3).first_step == 26
    assert grow_check.first_attempt_after(attempts, 56.0, 3) is None


def test_the_supervisors_decisions_are_read_with_their_relaunch_cost(grow_check):
    assumed = ("mpi_train supervise: New host(s) 10.93.0.5 joined ready: step 0.41 s on 2 ranks, about 0.27 s on 3; "
               "20 steps left save about 2 s against a relaunch of 60 s (assumed: --relaunch-cost): not growing. (4 "
               "slots offered, 3 ranks used: as many as split the global batch of 24)")
    found = grow_check.decisions_of([*TRANSCRIPT, (70.0, assumed), (71.0, step(30))])
    assert [(d.at, d.grows, d.relaunch_s, d.relaunch_kind) for d in found] == [
        (52.0, True, 9.0, "measured"), (53.0, False, None, None), (70.0, False, 60.0, "assumed")]


def test_the_grow_is_timed_from_the_link_up_against_cooldown_relaunch_and_slack(grow_check):
    args = Namespace(cooldown=10.0, timeout=10, host_wait=3.0)
    scenario = grow_check.Scenario("a", events={"cut": 8.5, "up": 40.0}, lines=TRANSCRIPT)
    grown = grow_check.grow_check(scenario, args)
    assert (grown.measured, grown.target, grown.ok) == (
        "20.0 s (decided after 12.0 s, relaunch 8.0 s)", "<= 10 + 8.0 + 5 = 23.0 s", True)
    early = grow_check.Scenario("a", events={"cut": 8.5, "up": 31.5}, lines=TRANSCRIPT)  # decided 20.5 s after
    assert grow_check.grow_check(early, args).ok is False
    restarted = grow_check.restart_check(scenario, args)
    assert (restarted.measured, restarted.target, restarted.ok) == (
        "21.5 s, from step 5", "<= 10 + 3 + 30 = 43 s", True)
    early_cut = grow_check.Scenario("b", events={"cut": 8.5}, lines=TRANSCRIPT)
    assert grow_check.restart_check(early_cut, args).ok is False  # b must start again from step 0


def test_losses_once_names_what_is_doubled_or_missing(grow_check):
    assert grow_check.losses_once({1: [2.0], 2: [1.9], 3: [1.8]}, 3) == "ok"
    assert grow_check.losses_once({1: [2.0], 2: [1.9, 1.9]}, 3) == "doubled [2], missing [3]"


def test_flags_that_cannot_hold_both_world_sizes_or_both_cuts_are_refused(grow_check):
    parser = grow_check.build_parser()
    with pytest.raises(UserError, match="multiple of 6"):
        grow_check.check_args(parser.parse_args(["--batch-size", "32"]))
    with pytest.raises(UserError, match="--early-cut-step 6 < --checkpoint-every 5"):
        grow_check.check_args(parser.parse_args(["--early-cut-step", "6"]))
    assert grow_check.check_args(parser.parse_args(["--scenarios", "c,a"])) == ["c", "a"]


def test_the_final_loss_is_judged_against_the_target_with_what_rounding_alone_does_beside_it(grow_check):
    args = grow_check.build_parser().parse_args(["--steps", "10"])
    reference = {"final_loss": 2.0, "steps": [{"step": s, "loss": 3.0 - 0.1 * s} for s in range(1, 11)]}
    losses = {s: [3.0 - 0.1 * s] for s in range(1, 11)}
    run = grow_check.Tracked(runs=1, status="FINISHED", losses=losses, world_sizes=[(0, 3), (5, 2)], restarts={})
    scenario = grow_check.Scenario("a", exit=0)
    close, far = (grow_check.run_checks(scenario, run, final, reference, 0.4, args)[2] for final in (2.001, 2.8))
    assert (close.measured, close.ok) == ("5.00e-04", True)
    assert (far.measured, far.ok) == ("4.00e-01", False)
    assert far.verdict == ("MISSED (steps 1-5, 3 ranks in both: at most 0.0e+00; the reference with --sync ring, "
                           "uninterrupted: 4.00e-01)")
    alone = grow_check.run_checks(scenario, run, 2.8, reference, None, args)[2]
    assert alone.note == "steps 1-5, 3 ranks in both: at most 0.0e+00"
