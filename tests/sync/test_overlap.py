"""--overlap and --fragments of localsgd and diloco: the merge rule against a hand computation on a real 2-rank Gloo
group (two processes), and the flags' refusals."""

import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import forked_ranks
from torch import nn

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.sync.averaging import OWN_SHARE
from mpi_train.sync.diloco import DiLoCo
from mpi_train.sync.localsgd import LocalSGD

STEPS = 6
SIZE = 4


def delta(step: int, rank: int) -> torch.Tensor:
    """What rank `rank`'s local step `step` adds to its model: quarters, so means of two are exact in float32."""
    return (step + 4 * rank) * torch.arange(1.0, SIZE + 1) / 4


class Vector(nn.Module):
    def __init__(self):
        super().__init__()
        self.x = nn.Parameter(torch.zeros(SIZE))


def run_rank(rank: int, store: str, queue, cases: dict, world: int = 2) -> None:
    """Each case: a method stepped STEPS times by the deltas above; the model after every step and after finish."""
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        results = {}
        for name, (cls, options) in cases.items():
            method, model = cls(**options), Vector()
            method.wrap(model)
            seen = []
            for step in range(1, STEPS + 1):
                method.sync(model)  # before the step: takes the anchor at the first local step
                with torch.no_grad():
                    model.x.add_(delta(step, rank))
                method.after_step(model)
                seen.append(model.x.detach().clone())
            method.finish(model)
            seen.append(model.x.detach().clone())
            results[name] = torch.stack(seen)
        queue.put((rank, results))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it
        queue.put((rank, traceback.format_exc()))


CASES = {
    "localsgd": (LocalSGD, {"period": 2, "overlap": True}),
    "localsgd-whole": (LocalSGD, {"period": 2, "overlap": True, "own_share": 1.0}),
    "localsgd-plain": (LocalSGD, {"period": 2}),
    "localsgd-fragments": (LocalSGD, {"period": 2, "fragments": 2, "overlap": True}),
    "localsgd-fragments-plain": (LocalSGD, {"period": 2, "fragments": 2}),
    "diloco": (DiLoCo, {"period": 2, "overlap": True, "outer_lr": 0.5, "outer_momentum": 0.5}),
}


def run_ranks(folder: Path, cases: dict, world: int) -> dict:
    """Every case on `world` ranks, each a process forked from this one: rank -> case -> the model after each step."""
    return forked_ranks(run_rank, world, str(folder / "store"), cases, world)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("overlap"), CASES, 2)


def mean_delta(*steps: int) -> torch.Tensor:
    return sum((delta(s, 0) + delta(s, 1)) / 2 for s in steps)


def own(rank: int, *steps: int) -> torch.Tensor:
    return sum(delta(s, rank) for s in steps)


def test_local_sgd_overlapped_merges_the_delayed_mean_as_a_correction(two_ranks):
    share = OWN_SHARE
    for rank in (0, 1):
        seen = two_ranks[rank]["localsgd"]
        # the end of period 1 (step 2): its change leaves; the model keeps its share of it
        assert torch.equal(seen[1], share * own(rank, 1, 2))
        # the end of period 2 (step 4): the kept share of period 1 gives way to the mean (the anchor's step), the
        # progress since stays whole, then period 2's change leaves and the model keeps its share of it
        assert torch.equal(seen[3], mean_delta(1, 2) + share * own(rank, 3, 4))
        assert torch.equal(seen[5], mean_delta(1, 2, 3, 4) + share * own(rank, 5, 6))
        # finish: the last sum merged, every rank on the anchor: local SGD's own end, reached one period late
        assert torch.equal(seen[6], mean_delta(1, 2, 3, 4, 5, 6))
        assert torch.equal(seen[6], two_ranks[rank]["localsgd-plain"][6])
        # the whole own change kept (LOSCAR-SGD's merge): x = anchor + own progress of the last period
        whole = two_ranks[rank]["localsgd-whole"]
        assert torch.equal(whole[1], own(rank, 1, 2))
        assert torch.equal(whole[3], mean_delta(1, 2) + own(rank, 3, 4))
        assert torch.equal(whole[5], mean_delta(1, 2, 3, 4) + own(rank, 5, 6))
        assert torch.equal(whole[6], seen[6])


def test_fragments_are_element_strided_and_averaged_in_turn(two_ranks):
    even, odd = slice(0, None, 2), slice(1, None, 2)
    for rank in (0, 1):
        plain = two_ranks[rank]["localsgd-fragments-plain"]
        # step 1 averages fragment 0 (elements 0, 2), step 2 fragment 1 (elements 1, 3), at once
        assert torch.equal(plain[0][even], mean_delta(1)[even]) and torch.equal(plain[0][odd], own(rank, 1)[odd])
        assert torch.equal(plain[1][odd], mean_delta(1, 2)[odd]) and torch.equal(plain[1][even],
                                                                                  (mean_delta(1) + own(rank, 2))[even])
        overlapped, share = two_ranks[rank]["localsgd-fragments"], OWN_SHARE
        # overlapped: fragment 0's sum of step 1 merges at step 2 (fragment 1's turn), fragment 1's at step 3; a
        # fragment whose change travels holds the rank's share of it
        assert torch.equal(overlapped[0][even], share * own(rank, 1)[even])
        assert torch.equal(overlapped[0][odd], own(rank, 1)[odd])
        assert torch.equal(overlapped[1][even], (mean_delta(1) + own(rank, 2))[even])
        assert torch.equal(overlapped[1][odd], share * own(rank, 1, 2)[odd])
        assert torch.equal(overlapped[2][odd], (mean_delta(1, 2) + own(rank, 3))[odd])
        assert torch.equal(overlapped[2][even], (mean_delta(1) + share * own(rank, 2, 3))[even])
        assert torch.equal(overlapped[6], plain[6])


def test_diloco_overlapped_takes_the_outer_step_with_the_delayed_mean(two_ranks):
    lr, momentum = 0.5, 0.5
    first = mean_delta(1, 2)  # the outer gradient is -first; Nesterov: anchor -= lr * (g + momentum * v), v = g
    anchor = lr * (1 + momentum) * first
    for rank in (0, 1):
        seen = two_ranks[rank]["diloco"]
        assert torch.equal(seen[1], OWN_SHARE * own(rank, 1, 2))
        assert torch.allclose(seen[3], anchor + OWN_SHARE * own(rank, 3, 4), atol=1e-6)
    assert torch.equal(two_ranks[0]["diloco"][6], two_ranks[1]["diloco"][6])  # made one at the end


def test_two_levels_overlapped_keep_the_mean_and_end_as_one_model(tmp_path):
    """4 ranks as 2 hosts of 2: each host's ranks average every step, all ranks every 4 steps in the background (and
    in 2 fragments). The deltas do not depend on the model, so every schedule that averages (host means, delayed
    corrections) keeps the ranks' mean, and the job ends on it: x0 + the mean of every rank's deltas."""
    hosts = [0, 0, 2, 2]
    cases = {"two-levels": (LocalSGD, {"period": 4, "host_period": 1, "overlap": True, "hosts": hosts}),
             "two-levels-fragments": (LocalSGD, {"period": 4, "host_period": 1, "overlap": True, "fragments": 2,
                                                 "hosts": hosts}),
             "two-levels-period-2": (LocalSGD, {"period": 2, "host_period": 1, "overlap": True, "hosts": hosts})}
    got = run_ranks(tmp_path, cases, 4)
    expected = sum(delta(s, r) for s in range(1, STEPS + 1) for r in range(4)) / 4
    check_two_levels_by_hand({rank: got[rank]["two-levels-period-2"] for rank in range(4)}, hosts)
    for name in cases:
        for rank in range(4):
            assert torch.equal(got[rank][name][-1], got[0][name][-1])
        assert torch.allclose(got[0][name][-1], expected, rtol=1e-6)
        # between averages of all, a host's two ranks agree (their every-step average), the hosts differ
        assert torch.equal(got[0][name][2], got[1][name][2]) and not torch.equal(got[0][name][2], got[2][name][2])


def check_two_levels_by_hand(seen: dict, hosts: list[int]) -> None:
    """Period 2 with --host-period 1 (a host average at every step that is not a boundary): three merges in 6
    steps against their closed forms. A boundary step is not a host's average (the sum of all leaves there): that
    step's own delta stays the rank's until the next step's host average, which makes the change in flight one
    within the host too."""
    def everyone(*steps):  # the mean of all 4 ranks' deltas
        return sum(delta(s, r) for s in steps for r in range(4)) / 4

    def host(rank, *steps):  # the mean of the deltas of rank's host
        return sum(delta(s, r) for s in steps for r in range(4) if hosts[r] == hosts[rank]) / 2

    share = OWN_SHARE
    for rank, x in seen.items():
        assert torch.equal(x[0], host(rank, 1))  # a host's average
        assert torch.equal(x[1], share * (host(rank, 1) + delta(2, rank)))  # the first change leaves, its share kept
        assert torch.equal(x[2], share * host(rank, 1, 2) + host(rank, 3))  # the change in flight made one in the host
        # each merge: the mean of all of the period before last, then the share of the last period's change (the
        # host's mean of its first step, the rank's own last step) that the rank keeps while it travels
        assert torch.allclose(x[3], everyone(1, 2) + share * (host(rank, 3) + delta(4, rank)), rtol=0, atol=1e-6)
        assert torch.allclose(x[5], everyone(1, 2, 3, 4) + share * (host(rank, 5) + delta(6, rank)), rtol=0, atol=1e-6)
        assert torch.allclose(x[6], everyone(*range(1, STEPS + 1)), rtol=0, atol=1e-6)  # finish: one model


def test_overlap_and_fragments_are_refused_where_they_cannot_run():
    with pytest.raises(UserError, match=r"--fragments 3 must divide --period 8.*1, 2, 4, 8"):
        TrainConfig(sync="localsgd", fragments=3).validate(world_size=2)
    with pytest.raises(UserError, match=r"--fragments must be at least 1"):
        TrainConfig(sync="localsgd", fragments=0).validate(world_size=2)
    with pytest.raises(UserError, match=r"--overlap is read by --sync localsgd and diloco only"):
        TrainConfig(sync="flat", overlap=True).validate(world_size=2)
    with pytest.raises(UserError, match=r"--local-momentum average with --overlap"):
        TrainConfig(sync="localsgd", overlap=True, local_momentum="average").validate(world_size=2)
    with pytest.raises(UserError, match=r"--compression powersgd with --overlap --fragments 2"):
        TrainConfig(sync="diloco", overlap=True, fragments=2, compression="powersgd").validate(world_size=2)
    TrainConfig(sync="diloco", period=16, fragments=4, overlap=True, compression="bf16").validate(world_size=2)
