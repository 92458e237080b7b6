"""Compressors in one process: N ranks simulated in lockstep, each message summed across them by hand."""

import pytest
import torch
from torch import nn

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.models import build_model
from mpi_train.sync import COMPRESSORS, SYNC_METHODS, backend_error, build_method, combination_error, label
from mpi_train.sync.compression.powersgd import PowerSGD

# A conv kernel (32 x 72) and a linear layer (40 x 60) that rank 2 shrinks more than tenfold, biases, and a small
# matrix it would shrink only 2.7-fold (sent whole, as VGG-11's first conv and classifier are).
SHAPES = [(32, 8, 3, 3), (32,), (40, 60), (40,), (10, 12)]


def make_params() -> list[nn.Parameter]:
    return [nn.Parameter(torch.zeros(shape)) for shape in SHAPES]


def reduce_in_lockstep(compressors, params_per_rank, grads_per_rank) -> list[list[torch.Tensor]]:
    """Each simulated rank packs its gradients into one flat buffer; every message is replaced by the sum over
    ranks before the next is asked for, as a schedule would. Returns each rank's averaged gradients."""
    world = len(compressors)
    datas = [torch.cat([g.reshape(-1) for g in grads]) for grads in grads_per_rank]
    views = []
    for data in datas:
        at, shaped = 0, []
        for shape in SHAPES:
            n = torch.Size(shape).numel()
            shaped.append(data[at:at + n].view(shape))
            at += n
        views.append(shaped)
    rounds = [c.rounds(params, d, v, world) for c, params, d, v in zip(compressors, params_per_rank, datas, views)]
    while True:
        messages = [next(r, None) for r in rounds]
        if all(m is None for m in messages):
            return views
        assert all(m is not None for m in messages), "every rank must send the same number of rounds"
        total = torch.stack(messages).sum(0)
        for m in messages:
            m.copy_(total)


def random_grads(generator, scale=1.0):
    return [torch.randn(shape, generator=generator) * scale for shape in SHAPES]


def test_powersgd_error_feedback_loses_nothing_only_delays_it():
    world, generator = 3, torch.Generator().manual_seed(1)
    compressors = [PowerSGD(rank=2, start_step=0) for _ in range(world)]
    params = [make_params() for _ in range(world)]
    previous = [[torch.zeros(shape) for shape in SHAPES] for _ in range(world)]
    for step in range(5):
        grads = [random_grads(generator) for _ in range(world)]
        applied = reduce_in_lockstep(compressors, params, grads)
        new = [[c.residual_of(p) if c.residual_of(p) is not None else torch.zeros(p.shape) for p in ps]
               for c, ps in zip(compressors, params)]
        for i in range(len(SHAPES)):
            assert all(torch.equal(applied[r][i], applied[0][i]) for r in range(world))  # one update for all ranks
            left = applied[0][i] + torch.stack([new[r][i] for r in range(world)]).mean(0)
            right = torch.stack([grads[r][i] + previous[r][i] for r in range(world)]).mean(0)
            assert torch.allclose(left, right, rtol=1e-5, atol=1e-5), (step, SHAPES[i], (left - right).abs().max())
        previous = [[t.clone() for t in rank] for rank in new]
    compressed = [i for i, shape in enumerate(SHAPES) if compressors[0].compressible(torch.Size(shape))]
    assert compressed == [0, 2]  # the conv kernel and the linear layer; vectors and the small matrix go whole
    assert any(previous[0][i].abs().max() > 1e-3 for i in compressed)  # rank 2 of random matrices does lose something


def test_powersgd_sends_vectors_and_small_matrices_whole_and_exact():
    world, generator = 2, torch.Generator().manual_seed(2)
    compressors = [PowerSGD(rank=2, start_step=0) for _ in range(world)]
    params = [make_params() for _ in range(world)]
    grads = [random_grads(generator) for _ in range(world)]
    applied = reduce_in_lockstep(compressors, params, grads)
    for i in (1, 3, 4):
        assert torch.allclose(applied[0][i], (grads[0][i] + grads[1][i]) / 2, rtol=1e-6, atol=1e-7)
        assert compressors[0].residual_of(params[0][i]) is None


def test_powersgd_of_rank_r_matrices_is_exact():
    world, rank, generator = 2, 2, torch.Generator().manual_seed(3)
    compressors = [PowerSGD(rank=rank, start_step=0) for _ in range(world)]
    params = [make_params() for _ in range(world)]
    bases = {i: torch.randn(SHAPES[i][0], rank, generator=generator) for i in (0, 2)}  # one column space for all ranks

    def low_rank(i):
        if i not in bases:
            return torch.randn(SHAPES[i], generator=generator)
        cols = torch.Size(SHAPES[i][1:]).numel()
        return (bases[i] @ torch.randn(rank, cols, generator=generator)).view(SHAPES[i])

    grads = [[low_rank(i) for i in range(len(SHAPES))] for _ in range(world)]
    applied = reduce_in_lockstep(compressors, params, grads)
    for i in (0, 2):
        mean = (grads[0][i] + grads[1][i]) / 2
        assert torch.allclose(applied[0][i], mean, rtol=1e-4, atol=1e-5), (applied[0][i] - mean).abs().max()
        residuals = [c.residual_of(ps[i]) for c, ps in zip(compressors, params)]
        assert (residuals[0] + residuals[1]).abs().max() < 1e-4  # each rank keeps M_r - mean; together nothing is left


def test_powersgd_averages_plainly_before_its_start_step():
    world, generator = 2, torch.Generator().manual_seed(4)
    compressors = [PowerSGD(rank=1, start_step=2) for _ in range(world)]
    params = [make_params() for _ in range(world)]
    for step in range(3):
        grads = [random_grads(generator) for _ in range(world)]
        applied = reduce_in_lockstep(compressors, params, grads)
        exact = all(torch.allclose(applied[0][i], (grads[0][i] + grads[1][i]) / 2, rtol=1e-6, atol=1e-6)
                    for i in range(len(SHAPES)))
        assert exact == (step < 2), step


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_narrow_float_compressors_average_within_their_precision(name):
    world, generator = 4, torch.Generator().manual_seed(5)
    compressors = [COMPRESSORS[name]() for _ in range(world)]
    params = [make_params() for _ in range(world)]
    grads = [random_grads(generator) for _ in range(world)]
    applied = reduce_in_lockstep(compressors, params, grads)
    eps = torch.finfo(compressors[0].wire_dtype).eps
    for i in range(len(SHAPES)):
        mean = torch.stack([g[i] for g in grads]).mean(0)
        bound = world * eps * max(g[i].abs().max() for g in grads)
        assert (applied[0][i] - mean).abs().max() <= bound
        assert not torch.equal(applied[0][i], mean)  # it does round: the check above is not vacuous


def test_float16_shares_vanish_at_half_the_smallest_subnormal():
    """A share of at most 2^-25 ≈ 2.98e-8 rounds to 0 (to even), above it to the smallest subnormal 2^-24."""
    world = 2
    compressors = [COMPRESSORS["fp16"]() for _ in range(world)]
    for gradient, survives in ((2 * 2.9e-8, False), (2 * 2**-25, False), (2 * 3.0e-8, True), (2 * 6e-8, True)):
        grads = [[torch.full(shape, gradient) for shape in SHAPES] for _ in range(world)]
        applied = reduce_in_lockstep(compressors, [make_params() for _ in range(world)], grads)
        assert bool(applied[0][0].abs().max() > 0) == survives, gradient


def test_wire_bytes_of_vgg11_shrink_as_the_compressors_promise():
    params = list(build_model("vgg11").parameters())
    full = sum(p.numel() * 4 for p in params)
    assert full == pytest.approx(36.9e6, rel=0.01)
    assert COMPRESSORS["none"]().wire_bytes(params) == full
    assert COMPRESSORS["fp16"]().wire_bytes(params) == full / 2 == COMPRESSORS["bf16"]().wire_bytes(params)
    powersgd = PowerSGD(rank=2).wire_bytes(params)
    assert powersgd < 1e6, powersgd
    assert (PowerSGD(rank=4).wire_bytes(params), PowerSGD(rank=8).wire_bytes(params)) == (426_024, 791_592)
    # its two rounds: a 3x3 conv kernel's Q (9·in x r) is nine times its P (out x r) when in = out
    conv = torch.nn.Conv2d(64, 64, 3, bias=True)
    assert PowerSGD(rank=2).round_bytes(list(conv.parameters())) == (4 * (64 * 2 + 64), 4 * 576 * 2)
    assert PowerSGD(rank=2).later_share(list(conv.parameters())) == pytest.approx(1152 / (192 + 1152))
    assert PowerSGD(rank=2).round_bytes(params) == (81_960, 161_280) and powersgd == 243_240  # VGG-11: 2/3 later
    assert COMPRESSORS["fp16"]().later_share(params) == 0.0  # one round


def test_impossible_combinations_are_refused_with_the_way_out():
    with pytest.raises(UserError, match=r"gather_scatter cannot carry --compression fp16.*allreduce, flat, bucketed"):
        TrainConfig(sync="gather_scatter", compression="fp16").validate(2)
    with pytest.raises(UserError, match=r"ddp cannot carry --compression powersgd.*--sync ddp_powersgd"):
        TrainConfig(sync="ddp", compression="powersgd").validate(2)
    with pytest.raises(UserError, match=r"flat_fp16 already compresses with fp16.*--sync flat --compression powersgd"):
        TrainConfig(sync="flat_fp16", compression="powersgd").validate(2)
    for sync in ("allreduce", "flat", "bucketed", "ring", "hierarchical"):
        for compression in COMPRESSORS:
            assert combination_error(sync, compression) is None
            TrainConfig(sync=sync, compression=compression).validate(2)
    with pytest.raises(UserError, match="--powersgd-rank must be positive"):
        TrainConfig(sync="flat", compression="powersgd", powersgd_rank=0).validate(2)


def test_old_names_keep_their_meaning_and_runs_are_labelled_by_both_halves():
    assert SYNC_METHODS["flat_fp16"].traits.compression_name("none") == "fp16"
    assert build_method("flat_fp16", TrainConfig(sync="flat_fp16")).traits.wire_dtype == torch.float16
    bf16 = build_method("flat", TrainConfig(sync="flat", compression="bf16"))
    assert bf16.traits.wire_dtype == torch.bfloat16
    assert label("bucketed", "powersgd") == "bucketed+powersgd" and label("flat_fp16", "fp16") == "flat_fp16"
    assert TrainConfig(sync="ring", compression="fp16").default_run_name(4) == "ring+fp16-np4-seed42"


def test_a_method_that_cannot_run_on_gloo_says_so_and_names_the_alternative():
    message = backend_error("ddp_powersgd", "gloo")
    assert "powerSGD_hook" in message and "--sync bucketed --compression powersgd" in message
    assert backend_error("ddp_powersgd", "nccl") is None
    assert all(backend_error(name, "gloo") is None for name in SYNC_METHODS if name != "ddp_powersgd")
