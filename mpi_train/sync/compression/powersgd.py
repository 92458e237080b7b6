"""powersgd: low-rank gradient compression (Vogels, Karimireddy, Jaggi: PowerSGD, NeurIPS 2019).

Each gradient matrix M (n x m; a conv kernel is read as out_channels x the rest) is sent
as two thin factors, P = M Q (n x r) and Q = M^T P (m x r), instead of n·m numbers:
VGG-11's 36.9 MB of gradients become 0.24 MB at rank 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import UserError
from ..flag_fields import option, option_names
from .base import Compressor

DEFAULT_RANK = 2
# Plain averaging for the first steps, while the gradients are large and change fast; the paper's
# reference implementation waits 100 steps too (start 10 cost 12.7 points of CIFAR-10 accuracy
# in one epoch, start 100 cost 1.5: docs/results.md).
DEFAULT_START_STEP = 100
# A matrix is factored only where that shrinks it more than tenfold (the reference implementation's
# advice); below that, rank r loses much of it and saves little: VGG-11's first conv and classifier.
MIN_COMPRESSION = 10
SEED = 20190502  # the first Q of every matrix, drawn alike on every rank


@dataclass(frozen=True)
class PowerSGDOptions:
    """PowerSGD's flags, read by --compression powersgd and ddp_powersgd (TrainConfig composes it). They default to
    None, so a job can tell them given to a job that runs no PowerSGD."""

    powersgd_rank: int | None = option(None, f"rank r of PowerSGD's factors (--compression powersgd, ddp_powersgd): "
                                       f"an n x m gradient travels as (n + m)·r numbers (default: {DEFAULT_RANK})")
    powersgd_start_step: int | None = option(None, f"steps of plain (uncompressed) averaging before PowerSGD starts "
                                             f"(ddp_powersgd: at least 2, torch's minimum; default: "
                                             f"{DEFAULT_START_STEP})")

    @property
    def powersgd_settings(self) -> tuple[int, int]:
        """(rank, start step) as PowerSGD runs them: given, or the defaults."""
        return (DEFAULT_RANK if self.powersgd_rank is None else self.powersgd_rank,
                DEFAULT_START_STEP if self.powersgd_start_step is None else self.powersgd_start_step)

    def check_powersgd(self) -> None:
        """Refused before any work starts, like every flag a job cannot run."""
        if self.powersgd_rank is not None and self.powersgd_rank <= 0:
            raise UserError(f"--powersgd-rank must be positive, got {self.powersgd_rank}. Pass a value greater than "
                            f"zero.")
        if self.powersgd_start_step is not None and self.powersgd_start_step < 0:
            raise UserError(f"--powersgd-start-step must not be negative, got {self.powersgd_start_step}.")


@dataclass
class Matrix:
    """One gradient sent as factors: its slot in the bucket and what it carries from step to step."""

    index: int  # position among the bucket's views
    rows: int
    cols: int
    p: torch.Tensor  # n x r, a slice of the bucket's first message
    qt: torch.Tensor  # Q transposed, r x m, a slice of the second message; kept as the next step's start (warm start)
    residual: torch.Tensor  # n x m: what this rank's compressed gradients have not delivered yet (error feedback)


class BucketMemory:
    """What PowerSGD keeps per bucket: its matrices' factors and residuals, and the two message buffers."""

    def __init__(self, views: Sequence[torch.Tensor], rank: int, compressible, generator: torch.Generator):
        like = views[0]
        shapes = [(v.shape[0], v.numel() // v.shape[0]) if compressible(v.shape) else None for v in views]
        # vectors (biases, BatchNorm), tiny matrices
        self.whole = [i for i, shape in enumerate(shapes) if shape is None]
        ranks = {i: min(rank, *shape) for i, shape in enumerate(shapes) if shape is not None}
        p_size = sum(shapes[i][0] * r for i, r in ranks.items())
        whole_size = sum(views[i].numel() for i in self.whole)
        # Ps, then the whole tensors
        self.first = torch.zeros(p_size + whole_size, dtype=like.dtype, device=like.device)
        self.second = torch.zeros(sum(shapes[i][1] * r for i, r in ranks.items()), dtype=like.dtype, device=like.device)
        self.matrices: list[Matrix] = []
        p_at = q_at = 0
        for i, r in ranks.items():
            rows, cols = shapes[i]
            q = torch.randn(cols, r, generator=generator, dtype=like.dtype).to(like.device)
            orthogonalise(q)
            qt = self.second[q_at:q_at + cols * r].view(r, cols)
            qt.copy_(q.t())
            p = self.first[p_at:p_at + rows * r].view(rows, r)
            residual = torch.zeros(rows, cols, dtype=like.dtype, device=like.device)
            self.matrices.append(Matrix(index=i, rows=rows, cols=cols, p=p, qt=qt, residual=residual))
            p_at, q_at = p_at + rows * r, q_at + cols * r
        self.whole_slots = []
        for i in self.whole:
            self.whole_slots.append(self.first[p_at:p_at + views[i].numel()])
            p_at += views[i].numel()
        self.steps = 0  # reductions of this bucket so far


def orthogonalise(matrix: torch.Tensor) -> None:
    """Replace the columns of `matrix` (n x r, r <= n) by an orthonormal basis of their span, in place.

    QR computes what Gram-Schmidt does, stably; a zero column (a zero gradient) still
    yields a unit vector, so nothing is divided by zero. The same input gives the same
    output on every rank, which keeps the replicas identical.
    """
    matrix.copy_(torch.linalg.qr(matrix, mode="reduced").Q)


class PowerSGD(Compressor):
    """Rank-r PowerSGD with warm start and error feedback, in two rounds of summing per bucket.

    Per bucket and step, each rank adds its residual to its gradients (M = g + e), then:
    1. P = M Q for each matrix (Q: last step's, the warm start that makes one power
       iteration per step enough); the Ps and the bucket's vectors, sent whole, are summed;
    2. P is orthogonalised (the same on every rank), Q = M^T P is computed and summed;
    3. every rank applies P Q^T / N (the mean of the ranks' rank-r projections P P^T M)
       and keeps e = M - P Q^T / N: what its gradient lost, sent in later steps.
    Q is kept transposed (r x m), so both products read M row by row: M (Q^T)^T and P^T M
    run 3-8 times faster on a CPU than M Q and M^T P with Q as m x r (VGG-11's largest kernel,
    512 x 4608 at rank 2, one thread: 2.3 ms against 9.7 ms for the pair).
    So after each step, the applied update plus the mean of the new residuals equals the
    mean gradient plus the mean of the previous residuals, exactly up to rounding: no
    gradient is ever lost, only delayed. A matrix whose factors would not be more than ten
    times smaller than itself (10·(n + m)·r >= n·m) and every vector are sent whole and averaged exactly.
    The first `start_step` reductions of each bucket are plain (whole, exact) averages.
    """

    name = "powersgd"
    rounds_per_step = 2  # the Ps (with the whole tensors), then the Qs
    tunables = option_names(PowerSGDOptions)

    def __init__(self, rank: int = DEFAULT_RANK, start_step: int = DEFAULT_START_STEP):
        if rank < 1:
            raise ValueError(f"PowerSGD's rank must be at least 1, got {rank}")
        if start_step < 0:
            raise ValueError(f"PowerSGD's start step must not be negative, got {start_step}")
        self.rank, self.start_step = rank, start_step
        self.memory: dict[tuple, BucketMemory] = {}
        self.pending: dict[tuple, dict] = {}  # bucket states from a checkpoint, not yet made into memories
        self.generator = torch.Generator().manual_seed(SEED)

    @classmethod
    def from_config(cls, config) -> PowerSGD:
        return cls(*config.powersgd_settings)

    def compressible(self, shape: torch.Size) -> bool:
        """A matrix (or conv kernel) whose rank-r factors are more than MIN_COMPRESSION times smaller than itself."""
        if len(shape) < 2:
            return False
        rows, cols = shape[0], math.prod(shape[1:])
        return MIN_COMPRESSION * (rows + cols) * min(self.rank, rows, cols) < rows * cols  # torch's hook's rule too

    def rounds(self, params, data, views, world):
        key = tuple(params)
        memory = self.memory.get(key)
        if memory is None:
            memory = self.memory[key] = BucketMemory(views, self.rank, self.compressible, self.generator)
            self.restore(key, memory)
        memory.steps += 1
        if memory.steps <= self.start_step or not memory.matrices:
            yield data
            data.div_(world)
            return
        gradients = [views[m.index].view(m.rows, m.cols) for m in memory.matrices]
        for m, gradient in zip(memory.matrices, gradients):
            gradient.add_(m.residual)  # error feedback: M = g + e
            torch.mm(gradient, m.qt.t(), out=m.p)
        for i, slot in zip(memory.whole, memory.whole_slots):
            slot.copy_(views[i].reshape(-1))
        yield memory.first  # round 1: the Ps and the whole tensors
        for i, slot in zip(memory.whole, memory.whole_slots):
            views[i].copy_(slot.view_as(views[i])).div_(world)
        for m, gradient in zip(memory.matrices, gradients):
            orthogonalise(m.p)
            torch.mm(m.p.t(), gradient, out=m.qt)  # Q^T = P^T M
        yield memory.second  # round 2: the Qs
        memory.second.div_(world)
        for m, gradient in zip(memory.matrices, gradients):  # two passes over each gradient, no temporary
            # e = M - P Q^T: what this rank's M has not delivered
            torch.addmm(gradient, m.p, m.qt, alpha=-1, out=m.residual)
            torch.mm(m.p, m.qt, out=gradient)  # the update, the same on every rank

    def state_dict(self, position):
        """Per bucket, by its parameters' places: reductions done, the warm-start Qs and this rank's residuals."""
        buckets = []
        for params, memory in self.memory.items():
            buckets.append({"params": [position[id(p)] for p in params], "steps": memory.steps,
                            "qt": memory.second.detach().cpu().clone(),
                            "residuals": [m.residual.detach().cpu().clone() for m in memory.matrices]})
        return {"rank": self.rank, "buckets": buckets}

    def load_state_dict(self, state, params):
        """Kept until each bucket's first reduction makes its memory (the buckets are known only then); the state
        of another --powersgd-rank does not fit, and that job starts afresh."""
        if state.get("rank") != self.rank:
            return
        self.pending = {tuple(params[i] for i in bucket["params"]): bucket for bucket in state["buckets"]}

    def restore(self, key: tuple, memory: BucketMemory) -> None:
        """A bucket's memory as the checkpoint left it, if it holds one for these parameters."""
        saved = self.pending.pop(key, None)
        if saved is None:
            return
        memory.steps = saved["steps"]
        memory.second.copy_(saved["qt"])
        for matrix, residual in zip(memory.matrices, saved["residuals"], strict=True):
            matrix.residual.copy_(residual)

    def residual_of(self, param: nn.Parameter) -> torch.Tensor | None:
        """This rank's residual for `param` (shaped like it), or None if it is sent whole (for the tests)."""
        for params, memory in self.memory.items():
            for m in memory.matrices:
                if params[m.index] is param:
                    return m.residual.view_as(param)
        return None

    def round_bytes(self, params: Sequence[nn.Parameter]) -> tuple[float, float]:
        """Bytes of the two rounds for these parameters: the Ps with the whole tensors, then the Qs."""
        first = second = 0
        for p in params:
            if self.compressible(p.shape):
                rows, cols = p.shape[0], p.numel() // p.shape[0]
                rank = min(self.rank, rows, cols)
                first, second = first + rows * rank * p.element_size(), second + cols * rank * p.element_size()
            else:
                first += p.numel() * p.element_size()
        return float(first), float(second)

    def wire_bytes(self, params: Sequence[nn.Parameter]) -> float:
        return sum(self.round_bytes(params))

    def later_share(self, params: Sequence[nn.Parameter]) -> float:
        """The Qs' share: most of a conv kernel's factors (out x 9·in: Q is the long one), less of a transformer's."""
        first, second = self.round_bytes(params)
        return second / (first + second) if first + second else 0.0
