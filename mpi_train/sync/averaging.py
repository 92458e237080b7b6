"""Model averaging: each rank takes optimizer steps alone and the ranks average their models every few steps.

The family that syncs less often (localsgd.py, diloco.py). Every `period` steps the ranks
sum their *change* since the last average (parameters - anchor, the anchor being the last
average, the same on every rank) and step the anchor with it; each rank then continues from
the new anchor. Sending the change rather than the parameters lets a compressor carry it as
it carries gradients: fp16 and bf16 round a small difference instead of the weights
themselves, and PowerSGD factors it with its error feedback (what a rank's change lost is
sent with the next one). Local SGD moves the anchor by the mean change; DiLoCo takes an
outer Nesterov step with it.

Before `local_start_step` steps have passed, gradients are averaged at every step, exactly
as `flat` does (post-local SGD: local steps once the early, fast-changing phase is over).
With `host_period` the average has two levels (jobs that span hosts): every `host_period`
steps the ranks of each host average among themselves over their fast local link, every
`period` steps all ranks do, the hosts' leaders alone crossing the network (hierarchical's
split). The optimizer's momentum buffers stay each rank's own by default (`momentum`): see
docs/sync-methods.md for why, and for the other two choices.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .base import AFTER_STEP, EVERY_COMPRESSION, PARAMETERS, SyncMethod, sum_each_round
from .compression.none import NoCompression
from .flat import Flat, FlatBuffer
from .hierarchical import Hierarchical, host_groups
from .messages import ONE_BUFFER

MOMENTUM = ("keep", "average", "reset")  # --local-momentum: what an average does to the optimizer's momentum buffers
DEFAULT_PERIOD = 8


def averaging_options(config) -> dict:
    """The averaging flags of a job's config, each left unset taking its default."""
    given = {"period": config.period, "local_start_step": config.local_start_step, "host_period": config.host_period,
             "momentum": config.local_momentum}
    defaults = {"period": DEFAULT_PERIOD, "local_start_step": 0, "host_period": 0, "momentum": "keep"}
    return {key: defaults[key] if value is None else value for key, value in given.items()}


class ModelAveraging(SyncMethod):
    """Average the ranks' models every `period` optimizer steps, after the step; subclasses move the anchor."""

    collective = "ring"  # one allreduce of the model's change (two levels: see __init__)
    tunables = ("period", "local_start_step", "host_period", "local_momentum")
    messages = ONE_BUFFER
    sends = AFTER_STEP
    averages = PARAMETERS
    compressions = EVERY_COMPRESSION
    message_name = "average"

    def __init__(self, compressor=None, period: int = DEFAULT_PERIOD, local_start_step: int = 0,
                 host_period: int = 0, momentum: str = "keep", hosts: Sequence[int] | None = None):
        super().__init__(compressor)
        if period < 1 or host_period < 0 or local_start_step < 0 or momentum not in MOMENTUM:
            raise ValueError(f"averaging: period {period}, host period {host_period}, start {local_start_step}, "
                             f"momentum {momentum!r}")
        self.period, self.local_start_step = period, local_start_step
        self.host_period, self.momentum = host_period, momentum
        self.hosts = list(hosts) if hosts is not None else None
        if host_period:
            self.collective = "hierarchical"  # across hosts; the hosts' own averages are priced apart (prediction.py)
        self.warmup = Flat()  # gradients averaged plainly until local_start_step
        self.plain = NoCompression()  # a host's own averages
        self.across = Hierarchical(hosts=self.hosts)  # the two-level sum, when the job has two levels
        self.two_levels, self.host_group = False, None
        self.optimizer: torch.optim.Optimizer | None = None
        self.steps = 0  # optimizer steps taken
        self.change: FlatBuffer | None = None  # this rank's parameters - anchor, summed across ranks
        self.anchor: torch.Tensor | None = None  # the last average, one flat copy, equal on every rank
        self.anchor_stale = True  # the parameters were synced since: the anchor is taken afresh before local steps
        self.drift: float | None = None  # this rank's distance from the last average, before it took it

    # -- setup ----------------------------------------------------------------------------------

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.host_period:  # collective: the groups of each host and of the leaders
            self.two_levels, self.across.leader, self.host_group, self.across.leader_group = host_groups(self.hosts)
            self.across.two_levels, self.across.host_group = self.two_levels, self.host_group
        return model

    def use_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def record_into(self, recorder) -> None:
        super().record_into(recorder)
        self.warmup.record_into(recorder)
        self.across.record_into(recorder)

    # -- each step ------------------------------------------------------------------------------

    def local(self, step: int) -> bool:
        """Step `step` (1-based) trains locally: past the warm-up of synced gradients."""
        return step > self.local_start_step

    def sync(self, model: nn.Module) -> None:
        """Before the optimizer step: the warm-up's gradient average, or nothing (a local step)."""
        step = self.steps + 1
        if not self.local(step):
            self.warmup.sync(model)
            self.anchor_stale, self.last_sync = True, "gradients"
            return
        self.last_sync = None
        if self.anchor_stale:  # every rank holds the same parameters here: the average the local steps start from
            params = trainable(model)
            if self.change is None:
                self.change = FlatBuffer(params)
                self.anchor = torch.empty_like(self.change.data)
            torch.cat([p.detach().reshape(-1) for p in params], out=self.anchor)
            self.anchor_stale = False

    def after_step(self, model: nn.Module) -> bool:
        self.steps += 1
        if not self.local(self.steps):
            return False
        local_steps = self.steps - self.local_start_step
        if local_steps % self.period == 0:
            self.average(model, self.across.allreduce_sum if self.two_levels else allreduce_sum, everyone=True)
            self.last_sync = "all"
            return True
        if self.host_period and self.two_levels and local_steps % self.host_period == 0:
            self.average(model, self.host_sum, everyone=False)
            self.last_sync = "host"
            return True
        return False

    def host_sum(self, data: torch.Tensor) -> None:
        dist.all_reduce(data, op=dist.ReduceOp.SUM, group=self.host_group)

    def average(self, model: nn.Module, allreduce: Callable[[torch.Tensor], None], everyone: bool) -> None:
        """Sum the ranks' change since the anchor (all ranks, or the ranks of each host) and move on from it. The
        compressor carries the averages of all ranks; a host's own, over its fast local link, go whole."""
        params, views = self.change.params, self.change.views
        anchors = self.anchor_views()
        with torch.no_grad():
            for p, view, anchor in zip(params, views, anchors):
                torch.sub(p, anchor, out=view)
            size = dist.get_world_size() if everyone else dist.get_world_size(self.host_group)
            codec = self.compressor if everyone else self.plain
            sum_each_round(codec.rounds(params, self.change.data, views, size), allreduce, self.recorder,
                           self.message_name if everyone else "average in host")
            # each rank's distance from the average it is about to take (the change's mean: `views` now)
            squares = [torch.sub(p, anchor).sub_(view).pow_(2).sum() for p, view, anchor in zip(params, views, anchors)]
            self.drift = float(torch.stack(squares).sum().sqrt())
            if everyone:
                self.step_anchor(self.change.data)
                for p, anchor in zip(params, anchors):
                    p.copy_(anchor)
            else:  # a host's average: its ranks agree, the anchor (the last average of all) stays
                for p, view, anchor in zip(params, views, anchors):
                    torch.add(anchor, view, out=p)
        self.average_momentum(everyone)

    def step_anchor(self, mean_change: torch.Tensor) -> None:
        """Move the anchor with the ranks' mean change (local SGD: by it; DiLoCo: an outer optimizer step)."""
        raise NotImplementedError

    def average_momentum(self, everyone: bool) -> None:
        """--local-momentum: keep each rank's buffers, average them too (as many bytes again), or reset them."""
        if self.momentum == "keep" or self.optimizer is None:
            return
        buffers = [state["momentum_buffer"] for state in self.optimizer.state.values()
                   if state.get("momentum_buffer") is not None]
        if not buffers:
            return
        if self.momentum == "reset":
            for buffer in buffers:
                buffer.zero_()
            return
        flat = torch.cat([b.reshape(-1) for b in buffers])
        group = None if everyone else self.host_group
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        flat.div_(dist.get_world_size(group))
        offset = 0
        for buffer in buffers:
            buffer.copy_(flat[offset:offset + buffer.numel()].view_as(buffer))
            offset += buffer.numel()

    def anchor_views(self) -> list[torch.Tensor]:
        views, offset = [], 0
        for p in self.change.params:
            views.append(self.anchor[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    def finish(self, model: nn.Module) -> bool:
        """The job's last step is done: average once more unless it just did, so the job ends with one model."""
        if not self.local(self.steps) or (self.steps - self.local_start_step) % self.period == 0:
            return False
        self.average(model, self.across.allreduce_sum if self.two_levels else allreduce_sum, everyone=True)
        return True

    @contextlib.contextmanager
    def evaluated(self, model: nn.Module) -> Iterator[None]:
        """Between averages each rank holds its own model: a test evaluation scores their plain mean, after which each
        rank goes on with its own, so evaluating changes nothing in training."""
        if not self.local(self.steps) or (self.steps - self.local_start_step) % self.period == 0:
            yield
            return
        params = trainable(model)
        own = [p.detach().clone() for p in params]
        with torch.no_grad():
            flat = torch.cat([p.reshape(-1) for p in params])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(dist.get_world_size())
            offset = 0
            for p in params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        try:
            yield
        finally:
            with torch.no_grad():
                for p, mine in zip(params, own):
                    p.copy_(mine)

    def start_at(self, step: int) -> None:
        self.steps = step

    # -- what the job asks of it ----------------------------------------------------------------

    def replicated(self, model: nn.Module) -> list[torch.Tensor]:
        """The last average (and a subclass's outer state): equal on every rank whether or not this step averaged."""
        if self.anchor is None or self.anchor_stale:
            return list(model.parameters())
        return [self.anchor, *self.outer_state()]

    def outer_state(self) -> list[torch.Tensor]:
        return []

    def figures(self) -> dict:
        drift, self.drift = self.drift, None
        return {} if drift is None else {"drift": drift}

    def state_dict(self, model: nn.Module) -> dict:
        """Besides the compressor's memory, what makes this rank's model its own between averages: its parameters
        and optimizer state (a checkpoint otherwise holds rank 0's), the anchor and the step count."""
        state = super().state_dict(model)
        state.update({"steps": self.steps, "anchor_stale": self.anchor_stale,
                      "anchor": None if self.anchor is None else self.anchor.detach().cpu().clone(),
                      "params": [p.detach().cpu().clone() for p in model.parameters()],
                      "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                      "outer": [t.detach().cpu().clone() for t in self.outer_state()]})
        return state

    def load_state_dict(self, state: dict, model: nn.Module) -> None:
        super().load_state_dict(state, model)
        if "steps" not in state:
            return
        self.steps, self.anchor_stale = state["steps"], state["anchor_stale"]
        with torch.no_grad():
            for p, saved in zip(model.parameters(), state["params"], strict=True):
                p.copy_(saved)
        if state["optimizer"] is not None and self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if state["anchor"] is not None:
            params = trainable(model)
            self.change = FlatBuffer(params)
            self.anchor = state["anchor"].to(self.change.data.device)
        for mine, saved in zip(self.outer_state(), state["outer"], strict=True):
            mine.copy_(saved)



def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def allreduce_sum(data: torch.Tensor) -> None:
    dist.all_reduce(data, op=dist.ReduceOp.SUM)
