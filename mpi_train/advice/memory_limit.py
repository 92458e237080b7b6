"""--memory-limit: the bytes a rank may hold, and which candidates the model predicts fit in them.

A candidate's memory per rank is the model's (netmodel/memory.py): the parameters, gradients and
SGD state a rank keeps, with what its method shards divided by N, and for ZeRO-3 one unit's
gathered parameters. A limit leaves out every configuration predicted above it, with the reason;
a method that shards is how a model too big for a replica on every rank still trains.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from torch import nn

from ..errors import UserError
from ..memory import UNITS, size
from ..netmodel.memory import predict_memory
from ..sync import SyncMethod
from .search import Candidate


def parse_size(text: str | None) -> int | None:
    """`2GiB` -> 2147483648 (B, KiB, MiB, GiB, TiB; a number alone is bytes); None for None."""
    if text is None:
        return None
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", text)
    unit = found.group(2).lower() if found else ""
    if not found or (unit and unit not in UNITS) or float(found.group(1)) <= 0:
        raise UserError(f"--memory-limit {text!r} is not a size: give a positive number with a unit of B, KiB, MiB, "
                        f"GiB or TiB, e.g. --memory-limit 2GiB or --memory-limit 512MiB (powers of 1024: what a "
                        f"rank may hold for parameters, gradients and optimizer state).")
    return int(float(found.group(1)) * UNITS[unit or "b"])


def held_per_rank(methods: dict[str, SyncMethod], model: nn.Module, world: int, state_slots: int
                  ) -> dict[str, float]:
    """Each configured method's predicted bytes per rank, by its label, with `state_slots` optimizer state tensors
    per parameter (optimizers.state_slots)."""
    return {label: predict_memory(method, model, world, state_slots).total for label, method in methods.items()}


def over(label: str, held: dict[str, float], limit: int | None) -> str | None:
    """Why `label` is left out under `limit`, or None when it fits (or there is no limit)."""
    if limit is None or held[label] <= limit:
        return None
    return f"predicted to hold {size(held[label])} per rank, over --memory-limit {size(limit)}"


def within(candidates: Sequence[Candidate], held: dict[str, float],
           limit: int | None) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The candidates predicted to fit in `limit` bytes per rank, and those left out with why; all of them without a
    limit."""
    fit = [c for c in candidates if over(c.label, held, limit) is None]
    left_out = [(c.label, why) for c in candidates if (why := over(c.label, held, limit))]
    return fit, left_out


def none_fit(held: dict[str, float], limit: int, world: int) -> UserError:
    """Every candidate is over the limit: say by how much, and what would fit."""
    least = min(held, key=held.get)
    return UserError(f"no sync method fits --memory-limit {size(limit)} per rank on {world} ranks: the least, "
                     f"{least}, is predicted to hold {size(held[least])} per rank (parameters, gradients and optimizer "
                     f"state). Raise the limit, run on more ranks with a method that shards (its share shrinks as "
                     f"1/N), or use a smaller model.")


def fitting(candidates: Sequence[Candidate], model: nn.Module, world: int, state_slots: int,
            limit: int | None) -> tuple[list[Candidate], list[tuple[str, str]], dict[str, float]]:
    """The candidates predicted to fit, those left out with why, and every one's predicted bytes per rank; a UserError
    when none fits (every rank computes the same, so all of them stop together)."""
    held = held_per_rank({c.label: c.method() for c in candidates}, model, world, state_slots)
    kept, left_out = within(candidates, held, limit)
    if candidates and not kept:
        raise none_fit(held, limit, world)
    return kept, left_out, held
