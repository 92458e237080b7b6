"""What the ranks decide together after each step: SIGUSR1 and a loss or weights gone inf or NaN, on a real 2-rank
Gloo group, and read a step late as on a GPU."""

import math
import os
import signal
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from conftest import forked_ranks

from mpi_train import preemption as preemption_module
from mpi_train.preemption import SIGNAL, Divergence, Preemption, StepAgreement, held_norm

CPU = torch.device("cpu")


def as_read(agreement: StepAgreement) -> tuple:
    """What a rank has agreed so far, in plain types (a NaN loss as its text, so that two ranks' can be compared)."""
    diverged = agreement.diverged
    return (agreement.signalled, diverged and (diverged.step, diverged.loss_ranks, diverged.weight_ranks,
                                               str(diverged.losses), diverged.last_finite))


def agree_on_rank(rank: int, store: str, queue) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        preemption = Preemption(listening=True, world_size=2)
        agreement = StepAgreement(preemption, rank, 2, CPU)
        # each rank its own loss; rank 1's goes NaN at step 3, and SIGUSR1 reaches rank 1 alone before step 2 ends
        seen = []
        for step, loss in enumerate([2.5 + rank, 2.0 + rank, math.nan if rank else 1.5], start=1):
            if step == 2 and rank == 1:
                os.kill(os.getpid(), SIGNAL)
            agreement.post(step, torch.tensor(loss), [torch.ones(3), torch.ones(2)])
            agreement.read(wait=False)
            seen.append(as_read(agreement))
        preemption.close()
        # a model-averaging method's ranks hold their own weights: rank 0's alone go inf, its loss still finite
        averaging = StepAgreement(Preemption(listening=False, world_size=2), rank, 2, CPU)
        averaging.post(1, torch.tensor(2.0), [torch.tensor([math.inf if rank == 0 else 1.0])])
        averaging.read(wait=False)
        queue.put((rank, (seen, as_read(averaging))))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it
        queue.put((rank, traceback.format_exc()))


def test_a_loss_gone_nan_on_one_rank_stops_every_rank_at_that_step_with_the_signal_in_the_same_all_reduce(tmp_path):
    got = forked_ranks(agree_on_rank, 2, str(tmp_path / "store"))
    assert got[0] == got[1]  # every rank decides alike, whichever rank saw what
    seen, averaging = got[0]
    assert seen[0] == (False, None)
    assert seen[1] == (True, None)  # rank 1's signal, agreed at the step it came
    assert seen[2] == (True, (3, (1,), (), str((1.5, math.nan)), (2, 2.5)))  # last finite: the mean of 2.0 and 3.0
    assert averaging == (False, (1, (), (0,), str((2.0, 2.0)), (1, 2.0)))


def test_on_a_gpu_a_step_is_read_once_the_next_is_posted_unless_the_host_waits_for_it():
    agreement = StepAgreement(Preemption(listening=False, world_size=1), 0, 1, CPU, lagged=True)
    weights = [torch.ones(4)]
    agreement.post(1, torch.tensor(2.0), weights)
    agreement.read(wait=False)
    assert agreement.last_finite is None  # step 1 is not read yet
    agreement.post(2, torch.tensor(math.inf), weights)
    agreement.read(wait=False)
    assert agreement.last_finite == (1, 2.0) and agreement.diverged is None
    agreement.post(3, torch.tensor(math.nan), weights)
    agreement.read(wait=False)
    assert (agreement.diverged.step, agreement.diverged.loss_ranks, agreement.diverged.last_finite) == (2, (0,),
                                                                                                      (1, 2.0))
    agreement.read(wait=True)  # the host waits: the newest step is read too, the first divergence stays the one told
    assert agreement.diverged.step == 2 and not agreement.pending


def test_a_signal_read_a_step_late_reads_the_step_it_checkpoints_too():
    preemption = Preemption(listening=False, world_size=1)
    agreement = StepAgreement(preemption, 0, 1, CPU, lagged=True)
    preemption.received = "SIGUSR1"  # what the SIGUSR1 handler does
    agreement.post(1, torch.tensor(2.0), [torch.ones(4)])
    agreement.read(wait=False)
    assert not agreement.signalled
    agreement.post(2, torch.tensor(2.0), [torch.tensor([math.nan])])
    agreement.read(wait=False)  # step 1's signal: step 2 is checkpointed next, so its weights are read first
    assert agreement.signalled and agreement.diverged.step == 2 and agreement.diverged.weight_ranks == (0,)


def test_under_torchrun_sigterm_stops_at_the_next_boundary_and_acts_as_sigterm_only_if_no_stop_is_agreed(monkeypatch):
    """torchrun's agent stops the workers with SIGTERM to restart them at a new size: the job takes it as SIGUSR1, and
    what SIGTERM does otherwise (the tracker's handling) comes only if the ranks have not agreed to stop in time."""
    monkeypatch.setattr(preemption_module, "TERMINATE_GRACE_S", 0.2)
    late = []
    for stops in (True, False):
        preemption = Preemption(listening=True, world_size=1, terminate_at_boundary=True)
        preemption.late_terminate = lambda stops=stops: late.append(stops)
        agreement = StepAgreement(preemption, 0, 1, CPU)
        os.kill(os.getpid(), signal.SIGTERM)  # this process lives on: its handler notes it
        assert preemption.received == "SIGTERM" and not late
        if stops:
            agreement.post(1, torch.tensor(2.0), [])
            agreement.read(wait=True)
            assert agreement.signalled
        time.sleep(0.6)
        preemption.close()
    assert late == [False]  # the job that stopped at its boundary was not also ended as SIGTERM would
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # closed: the handler this process had is back
    elsewhere = Preemption(listening=True, world_size=1)  # mpirun, srun: SIGTERM is the trackers' (a stop, now)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    elsewhere.close()


def test_the_weights_norm_is_finite_only_when_every_weight_is():
    assert math.isfinite(held_norm([torch.ones(3), torch.full((2, 2), -7.0)]))
    assert math.isinf(held_norm([torch.ones(3), torch.tensor([1.0, -math.inf])]))
    assert math.isnan(held_norm([torch.tensor([math.nan]), torch.ones(3)]))


def test_the_message_names_the_step_the_ranks_the_last_finite_loss_the_checkpoint_kept_and_what_to_try():
    diverged = Divergence(7, (1, 3), (3,), (2.0, math.nan, 2.1, math.inf), (6, 2.25))
    message = diverged.message(0.5, 40, True, Path("ck/step-00000006.pt"))
    assert "\n" not in message and diverged.first_rank == 1
    assert message.startswith("training diverged at step 7: the loss was inf, nan on rank(s) 1, 3 and the step's "
                              "update left weights that are inf or NaN on rank(s) 3 (the last finite loss, averaged "
                              "over the ranks, was 2.25 at step 6). Every rank stopped; no checkpoint holds its "
                              "weights, and those before it are kept (the latest: ck/step-00000006.pt;")
    assert "a lower --lr (this job's peak rate is 0.5), a longer --warmup-steps (this job's: 40)" in message
    early = Divergence(1, (), (0, 1), (2.3, 2.5), (1, 2.4)).message(math.inf, 0, True, None)
    assert "(its loss, averaged over the ranks, was still finite: 2.4). Every rank stopped, before its first " \
           "checkpoint." in early and "peak rate is inf" in early
    # a first loss that is not finite came before any update: the data or the model, not the rate
    first = Divergence(1, (0,), (), (math.nan, 2.3), None).message(0.1, 0)
    assert "(this job's first step, with no finite loss before it). Every rank stopped. No update had been made " \
           "yet, so the rate is not the cause: the data (an inf or NaN among the inputs)" in first
    assert "--lr" not in first
