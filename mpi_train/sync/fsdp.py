"""fsdp: PyTorch's FSDP2 (`fully_shard`), one unit per layer block: parameters, gradients and optimizer state sharded
(ZeRO-3)."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from ..step.precision import PRECISION_AUTO, PRECISIONS, resolve
from .base import EVERYTHING, INSIDE_FSDP, SyncMethod, compressor_for
from .messages import PER_UNIT
from .traits import LAYERWISE_GATHER, Traits

# torch's FSDP2 and its state_dict API are imported where a job runs fsdp: they bring in DTensor and sympy, 0.6 s of
# import in every process (each rank of every job, each command) that never shards.


def whole_on_rank_0():
    """Gathered, on CPU, on rank 0 only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def whole_everywhere():
    """Every rank hands over the whole, keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True)


def container(module: nn.Module) -> bool:
    return isinstance(module, (nn.Sequential, nn.ModuleList))


def units(model: nn.Module) -> list[nn.Module]:
    """The layer blocks sharded as units of their own: each child with parameters of the model's stacks (a
    Sequential or ModuleList at its top level, or the model itself when it is one: VGG's features and classifier,
    ResNet's layer1-4 blocks, GPT's transformer blocks). A child sharing a parameter with anything outside it (GPT's
    tied embedding and head) stays with the root, which takes whatever no unit holds."""
    owners: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), set()).add(name)
    stacks = [model] if container(model) else [child for child in model.children() if container(child)]
    prefix_of = {id(module): name for name, module in model.named_modules()}
    found = []
    for stack in stacks:
        for child in stack.children():
            params = list(child.parameters())
            prefix = prefix_of[id(child)] + "."
            if params and all(all(name.startswith(prefix) for name in owners[id(p)]) for p in params):
                found.append(child)
    return found


class FSDP(SyncMethod):
    """torch's sharded data parallel, as the peer of `zero` (ddp is bucketed's).

    Each rank keeps 1/N of every parameter (a DTensor shard). Before a unit's forward its
    parameters are all-gathered and, after it, freed again (reshard after forward); backward
    gathers them once more, and each unit's gradients are reduce-scattered as soon as they
    are ready, so every rank ends backward with the mean gradient of its own shard, which
    the job's optimizer (built over the sharded parameters) steps. Bytes per rank: up to
    3(N-1)/N·S a step (two all-gathers and one reduce-scatter), against a ring allreduce's
    2(N-1)/N·S, and 2(N-1)/N·S under a mixed precision, whose all-gathers carry half-size
    copies (traits' gathered_dtype); memory per rank (P+G+O)/N plus one unit's gathered parameters.

    Everything travels inside torch's hooks during forward and backward, so sync() has
    nothing left to do, and the messages are not noted in a timeline. Checkpoints gather
    the whole model and optimizer state (torch.distributed.checkpoint's state_dict API) and
    keep them in an unsharded optimizer's layout, keyed by parameter index, so a job resumes
    under any method and, with --reshard, on another number of ranks.
    """

    # all-gathers around each unit, reduce-scatters in backward: two all-gathers, one reduce-scatter per unit
    # (netmodel.tensor_units), not cut by --bucket-mb
    traits = Traits(
        family=LAYERWISE_GATHER, shards=EVERYTHING, messages=PER_UNIT, sends=INSIDE_FSDP,
        overlaps_only_on_cuda=("FSDP2 issues its all-gathers and reduce-scatters without async_op and overlaps them "
                               "with compute on CUDA streams; on CPU each blocks where it is issued"),
        no_compression_because="FSDP reduce-scatters the gradients in torch's own collectives, in the parameters' "
                               "dtype")

    def __init__(self, compressor=None, precision: str = "32-true"):
        super().__init__(compressor)
        self.precision = precision  # --precision; `auto` is resolved on the model's device when it is wrapped
        gathered = PRECISIONS[precision].autocast_dtype if precision in PRECISIONS else None
        if gathered is not None:  # the policy's all-gathers: half the parameters' bytes (what the cost model prices)
            self.traits = self.traits.configured(gathered_dtype=gathered)

    @classmethod
    def _from_config(cls, config) -> FSDP:
        return cls(compressor_for(cls, config), getattr(config, "precision", PRECISION_AUTO))

    def policy(self, device: torch.device):
        """Under a mixed precision, FSDP2's own: each unit's parameters gathered in the autocast dtype (half the
        all-gather's bytes, and the copy forward and backward compute with), the gradients reduce-scattered and kept
        in float32, as the other methods sum and keep them. Autocast still runs around forward, for the ops between
        the units' parameters."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtype = resolve(self.precision, device).autocast_dtype
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        policy = self.policy(next(model.parameters()).device)
        for unit in units(model):
            fully_shard(unit, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model

    @contextlib.contextmanager
    def accumulating(self, net: nn.Module):
        """FSDP2's own way: a micro-batch's gradients stay unsharded and add up, reduce-scattered with the last's."""
        net.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            net.set_requires_gradient_sync(True)

    def sync(self, model: nn.Module) -> None:
        """Nothing left to do: backward has reduce-scattered every unit's gradients already."""

    @contextlib.contextmanager
    def evaluated(self, model: nn.Module):
        """Reshard after a test evaluation: FSDP2 keeps the root's parameters gathered after its forward, for the
        backward that follows in training; after a forward alone they would stay whole (GPT's embeddings and head),
        plain tensors where every reader of the model expects its shards."""
        from torch.distributed.fsdp import FSDPModule

        try:
            yield
        finally:
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    def _whole_parameters(self, model: nn.Module) -> list[torch.Tensor]:
        return [param.full_tensor() for param in model.parameters()]

    def _replicated(self, model: nn.Module) -> list[torch.Tensor]:
        """Each parameter gathered whole: the model every rank's shards make up."""
        return self._whole_parameters(model)

    def _model_state(self, model: nn.Module) -> dict | None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(model, options=whole_on_rank_0())  # collective: every rank sends its shards
        return state if dist.get_rank() == 0 else None

    def _load_model_state(self, model: nn.Module, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(model, state, options=whole_everywhere())

    def _optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> dict | None:
        """Collective: the whole state, keyed by parameter index (torch keys it by parameter name)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        named = get_optimizer_state_dict(model, optimizer, options=whole_on_rank_0())
        if dist.get_rank() != 0:
            return None
        index_of = {name: i for i, (name, _) in enumerate(model.named_parameters())}
        return {"state": {index_of[name]: value for name, value in named["state"].items()},
                "param_groups": [{**group, "params": [index_of[name] for name in group["params"]]}
                                 for group in named["param_groups"]]}

    def _load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict, model: nn.Module) -> None:
        names = [name for name, _ in model.named_parameters()]
        named = {"state": {names[int(i)]: value for i, value in state["state"].items()},
                 "param_groups": [{**group, "params": [names[int(i)] for i in group["params"]]}
                                  for group in state["param_groups"]]}
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, named, options=whole_everywhere())
