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

With `overlap` the sum of period k's change travels in the background (background.py) while
period k+1 computes; meanwhile the rank's model holds the anchor plus a share (OWN_SHARE) of its
own period-k change, and at the end of period k+1 the delayed mean is merged as a correction:
the anchor takes its step with it, the kept share gives way to it, and the rank's progress since
stays whole (x += new anchor - old anchor - kept share of the own change). With
`fragments` F the flat model is cut element-strided (element j in fragment j mod F) and one
fragment is averaged every period/F steps, so the link carries 1/F of the model at a time; with
`overlap` too, each fragment's sum is merged at the next fragment's turn. docs/sync-methods.md
gives the rules and their cost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from .averaging_options import DEFAULT_PERIOD, MOMENTUM, STREAMED_COMPRESSIONS, AveragingOptions
from .background import Background, Sent
from .base import AFTER_STEP, EVERY_COMPRESSION, PARAMETERS, Synced, SyncMethod, sum_each_round
from .compression.none import NoCompression
from .flag_fields import option_names
from .flat import Flat, FlatBuffer
from .hierarchical import Hierarchical, host_groups
from .messages import ONE_BUFFER
from .traits import RING_ALLREDUCE, TWO_LEVEL, Cadence, Traits

OVERLAP = " --overlap"  # after a compression in an accuracy_costs key: the cost measured with the averages overlapped
FRAGMENTED = OVERLAP + " --fragments 4"  # ... overlapped, a quarter of the model at a time
# the streamed schedules the advisor lists after a label, each with the options it sets
STREAMED = {OVERLAP: {"overlap": True}, FRAGMENTED: {"overlap": True, "fragments": 4}}
OWN_SHARE = 0.5  # --overlap: the share of its newest change a rank keeps in its model while that change travels


def averaging_options(config) -> dict:
    """ModelAveraging's keyword arguments for a job's config: its averaging flags, each left unset taking its
    default, and the job's --timeout, which the background sum's group waits as long as its collectives."""
    settings = config.averaging_settings()
    settings["momentum"] = settings.pop("local_momentum")
    return {**settings, "timeout_s": config.timeout}


class ModelAveraging(SyncMethod):
    """Average the ranks' models every `period` optimizer steps, after the step; subclasses move the anchor."""

    # one allreduce of the model's change (two levels: see __init__)
    traits = Traits(family=RING_ALLREDUCE, tunables=option_names(AveragingOptions), messages=ONE_BUFFER,
                    sends=AFTER_STEP, averages=PARAMETERS, compressions=EVERY_COMPRESSION)
    message_name = "average"

    def __init__(self, compressor=None, period: int = DEFAULT_PERIOD, local_start_step: int = 0,
                 host_period: int = 0, momentum: str = "keep", hosts: Sequence[int] | None = None,
                 overlap: bool = False, fragments: int = 1, timeout_s: float | None = None,
                 own_share: float = OWN_SHARE):
        super().__init__(compressor)
        self.timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
        if period < 1 or host_period < 0 or local_start_step < 0 or momentum not in MOMENTUM or fragments < 1 \
                or period % fragments:
            raise ValueError(f"averaging: period {period}, host period {host_period}, start {local_start_step}, "
                             f"momentum {momentum!r}, fragments {fragments}")
        if not 0 <= own_share <= 1:
            raise ValueError(f"averaging: own share {own_share}, not in [0, 1]")
        self.overlap, self.fragments, self.own_share = overlap, fragments, own_share
        self.streamed = overlap or fragments > 1  # the schedule of slots below, not one average of all every period
        if self.streamed and (momentum != "keep" or self.compressor.name not in STREAMED_COMPRESSIONS):
            raise ValueError(f"averaging: --overlap and --fragments take momentum 'keep' and compression none, fp16 "
                             f"or bf16, not {momentum!r} and {self.compressor.name!r}")
        self.slot = period // fragments  # steps between two fragments' averages
        self.sender: Background | None = None  # the background sum, with --overlap
        self.in_flight: InFlight | None = None  # the fragment whose sum is travelling, and this rank's change in it
        self.period, self.local_start_step = period, local_start_step
        self.host_period, self.momentum = host_period, momentum
        self.hosts = list(hosts) if hosts is not None else None
        # with a host period, across hosts in two levels; the hosts' own averages are priced apart (prediction.py)
        cadence = Cadence(period=period, fragments=fragments, host_period=host_period, overlap=overlap)
        self.traits = self.traits.configured(family=TWO_LEVEL if host_period else self.traits.family, cadence=cadence)
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
        if self.overlap:
            device = next(model.parameters()).device
            self.sender = Background(self.background_sum(device.type == "cuda"), device)
        return model

    def background_sum(self, on_cuda: bool) -> Callable[[torch.Tensor], None]:
        """How the background sum reaches the other ranks (background.py says why). Gloo: groups of its own, opened
        now (collective), for its thread. NCCL: the job's own groups, driven from this thread on a side stream."""
        behind = Hierarchical(hosts=self.hosts)  # its recorder notes nothing: the sum is noted whole, when merged
        if on_cuda:
            if not self.two_levels:
                return allreduce_sum
            behind.two_levels, behind.leader = True, self.across.leader
            behind.host_group, behind.leader_group = self.host_group, self.across.leader_group
            return behind.allreduce_sum
        if not self.two_levels:
            group = dist.new_group(list(range(dist.get_world_size())), timeout=self.timeout)
            return lambda data: dist.all_reduce(data, op=dist.ReduceOp.SUM, group=group)
        behind.two_levels, behind.leader, behind.host_group, behind.leader_group = host_groups(self.hosts, self.timeout)
        return behind.allreduce_sum

    def make_optimizer(self, model: nn.Module, build: Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
                       ) -> torch.optim.Optimizer:
        """The job's optimizer, kept: an average reaches its state (--local-momentum)."""
        self.optimizer = super().make_optimizer(model, build)
        return self.optimizer

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
            self.anchor_stale = True
            return
        if self.anchor_stale:  # every rank holds the same parameters here: the average the local steps start from
            params = trainable(model)
            if self.change is None:
                self.change = FlatBuffer(params)
                self.anchor = torch.empty_like(self.change.data)
            torch.cat([p.detach().reshape(-1) for p in params], out=self.anchor)
            self.anchor_stale = False

    def after_step(self, model: nn.Module) -> Synced:
        """The warm-up's gradients, or when due an average across all ranks or in each host, or a local step."""
        self.steps += 1
        if not self.local(self.steps):
            return Synced(scope="gradients", figures=self._figures())
        local_steps = self.steps - self.local_start_step
        if self.streamed and local_steps % self.slot == 0:
            self.average_fragment(model, (local_steps // self.slot - 1) % self.fragments)
            return Synced(scope="all", averaged=True, figures=self._figures())
        if not self.streamed and local_steps % self.period == 0:
            self.average(model, self.across.allreduce_sum if self.two_levels else allreduce_sum, everyone=True)
            return Synced(scope="all", averaged=True, figures=self._figures())
        if self.host_period and self.two_levels and local_steps % self.host_period == 0:
            self.average(model, self.host_sum, everyone=False)
            if self.in_flight is not None:  # the host's ranks now hold one model: their changes in flight, which the
                for own in self.in_flight.held():  # merge takes out again, become one too (the mean of all unchanged)
                    self.host_sum(own)
                    own.div_(dist.get_world_size(self.host_group))
            return Synced(scope="host", averaged=True, figures=self._figures())
        return Synced(scope=None, figures=self._figures())

    # -- fragments and overlap -------------------------------------------------------------------

    def fragment(self, index: int) -> slice:
        """The elements of the flat model in fragment `index`: every F-th from `index` (all of them when F = 1)."""
        return slice(index, None, self.fragments)

    def flat_model(self) -> torch.Tensor:
        """The parameters, copied into the flat work buffer (the change's)."""
        torch.cat([p.detach().reshape(-1) for p in self.change.params], out=self.change.data)
        return self.change.data

    def set_model(self, flat: torch.Tensor) -> None:
        """The parameters, copied back from a flat model (the work buffer, or the anchor)."""
        offset = 0
        with torch.no_grad():
            for p in self.change.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def average_fragment(self, model: nn.Module, index: int) -> None:
        """Fragment `index`'s turn. Without overlap: its change summed now, the anchor stepped, the rank restarts
        the fragment from the anchor. With overlap: the fragment in flight is merged first (waiting for its sum
        only if it has not arrived), then this one's change leaves in the background."""
        flat, anchor = self.flat_model(), self.anchor
        if self.overlap and self.in_flight is not None:
            self.merge(flat)
        where = self.fragment(index)
        own = flat[where] - anchor[where]  # a contiguous copy: this rank's change of the fragment since its anchor
        world = dist.get_world_size()
        if not self.overlap:
            mean = own.clone()
            sum_each_round(self.compressor.rounds([("fragment", index)], mean, [mean], world),
                           self.across.allreduce_sum if self.two_levels else allreduce_sum, self._recorder,
                           self.message_name)
            self.drift = float(torch.sub(own, mean).norm())
            self.step_anchor(mean, where)
            flat[where] = anchor[where]
        else:
            mean = own.clone()  # the compressor works on it in place, in the background
            kept = own if self.own_share == 1 else own * self.own_share
            self.in_flight = InFlight(index, own, mean, kept)
            self.sender.start(self.compressor.rounds([("fragment", index)], mean, [mean], world))
            if kept is not own:  # the rank goes on from the anchor plus its share of the change in flight
                flat[where] = anchor[where] + kept
        self.set_model(flat)

    def merge(self, flat: torch.Tensor) -> None:
        """The delayed mean of the fragment in flight, as a correction: the anchor steps with it, and the share of
        its own change the rank kept gives way to it, the progress made since kept whole (flat = new anchor +
        progress; docs/sync-methods.md says why)."""
        travelling, self.in_flight = self.in_flight, None
        if travelling.sent is None:
            travelling.sent = self.sender.wait()
        if travelling.sent is not ARRIVED:
            self._recorder.background(self.message_name, travelling.sent.start, travelling.sent.end,
                                     travelling.sent.nbytes)
        where = self.fragment(travelling.index)
        progress = flat[where] - self.anchor[where] - travelling.kept
        self.drift = float(torch.sub(travelling.own, travelling.mean).norm())
        self.step_anchor(travelling.mean, where)
        flat[where] = self.anchor[where] + progress

    def settle(self) -> None:
        """Wait for the sum in flight, if any, keeping it to merge at its turn (a checkpoint holds nothing in
        flight)."""
        if self.in_flight is not None and self.in_flight.sent is None:
            self.in_flight.sent = self.sender.wait()

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
            sum_each_round(codec.rounds(params, self.change.data, views, size), allreduce, self._recorder,
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

    def step_anchor(self, mean_change: torch.Tensor, where: slice = slice(None)) -> None:
        """Move the anchor's elements `where` with the ranks' mean change of them (local SGD: by it; DiLoCo: an outer
        optimizer step)."""
        raise NotImplementedError

    def average_momentum(self, everyone: bool) -> None:
        """--local-momentum: keep each rank's optimizer state, average it too (as many bytes again per state tensor),
        or reset it. The state is every per-parameter tensor the optimizer keeps: SGD's momentum buffer, AdamW's two
        moments; a reset zeroes AdamW's step count too, so its bias correction starts again with its moments."""
        if self.momentum == "keep" or self.optimizer is None:
            return
        states = [(param, state) for param, state in self.optimizer.state.items() if isinstance(state, dict)]
        if self.momentum == "reset":
            for _, state in states:
                for value in state.values():
                    if torch.is_tensor(value):
                        value.zero_()
            return
        buffers = [value for param, state in states for value in state.values()
                   if torch.is_tensor(value) and value.shape == param.shape]  # the moments, not a step count
        if not buffers:
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
        """The job's last step is done: average once more unless it just did, so the job ends with one model. With
        overlap the sum in flight is merged first: the one wait of the job."""
        if not self.local(self.steps):
            return False
        boundary = (self.steps - self.local_start_step) % self.period == 0
        if not self.streamed:
            if boundary:
                return False
            self.average(model, self.across.allreduce_sum if self.two_levels else allreduce_sum, everyone=True)
            return True
        if self.in_flight is not None:
            flat = self.flat_model()
            self.merge(flat)
            self.set_model(flat)
        if boundary and self.fragments == 1:  # nothing trained since the sum just merged: every rank takes the anchor
            self.set_model(self.anchor)
            return False
        self.average(model, self.across.allreduce_sum if self.two_levels else allreduce_sum, everyone=True)
        return True

    @contextlib.contextmanager
    def evaluated(self, model: nn.Module) -> Iterator[None]:
        """Between averages each rank holds its own model: a test evaluation scores their plain mean, after which each
        rank goes on with its own, so evaluating changes nothing in training."""
        averaged_now = not self.streamed and (self.steps - self.local_start_step) % self.period == 0
        if not self.local(self.steps) or averaged_now:
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

    def _start_at(self, step: int) -> None:
        self.steps = step

    # -- what the job asks of it ----------------------------------------------------------------

    def _replicated(self, model: nn.Module) -> list[torch.Tensor]:
        """The last average (and a subclass's outer state): equal on every rank whether or not this step averaged."""
        if self.anchor is None or self.anchor_stale:
            return list(model.parameters())
        return [self.anchor, *self.outer_state()]

    def outer_state(self) -> list[torch.Tensor]:
        return []

    def _figures(self) -> dict:
        """The drift of the last average since the last step's report, taken once."""
        drift, self.drift = self.drift, None
        return {} if drift is None else {"drift": drift}

    def _own_state(self, model: nn.Module) -> dict:
        """Besides the compressor's memory, what makes this rank's model its own between averages: its parameters
        and optimizer state (a checkpoint otherwise holds rank 0's), the anchor and the step count."""
        self.settle()
        state = super()._own_state(model)
        travelling = self.in_flight
        state.update({"in_flight": None if travelling is None else {
                          "index": travelling.index, "own": travelling.own.detach().cpu().clone(),
                          "mean": travelling.mean.detach().cpu().clone(),
                          "kept": travelling.kept.detach().cpu().clone()},
                      "steps": self.steps, "anchor_stale": self.anchor_stale,
                      "anchor": None if self.anchor is None else self.anchor.detach().cpu().clone(),
                      "params": [p.detach().cpu().clone() for p in model.parameters()],
                      "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                      "outer": [t.detach().cpu().clone() for t in self.outer_state()]})
        return state

    def _load_own_state(self, state: dict, model: nn.Module) -> None:
        super()._load_own_state(state, model)
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
        travelling = state.get("in_flight")
        if travelling is not None:  # arrived before the checkpoint was taken: merged at its turn, as it would have been
            device = self.anchor.device
            own = travelling["own"].to(device)
            # no "kept": a checkpoint of the rule that kept the whole change, which its model holds
            kept = travelling["kept"].to(device) if self.own_share != 1 and "kept" in travelling else own
            self.in_flight = InFlight(travelling["index"], own, travelling["mean"].to(device), kept, sent=ARRIVED)


@dataclass
class InFlight:
    """A fragment whose sum travels in the background: its index, this rank's change in it, the buffer that
    becomes the ranks' mean change once the sum is done, the part of the change the rank's model still holds (the
    own change itself, or its share) and `sent`: the sum's timing, once waited for."""

    index: int
    own: torch.Tensor
    mean: torch.Tensor
    kept: torch.Tensor
    sent: Sent | None = None

    def held(self) -> list[torch.Tensor]:
        """The rank's own tensors of the fragment (one when the model keeps its whole change)."""
        return [self.own] if self.kept is self.own else [self.own, self.kept]


ARRIVED = Sent(0.0, 0.0, 0.0)  # a sum that was done when a checkpoint took it: its messages went in the job before


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def allreduce_sum(data: torch.Tensor) -> None:
    dist.all_reduce(data, op=dist.ReduceOp.SUM)
