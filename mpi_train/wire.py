"""What ranks send each other as objects: plain data, checked on arrival; never a pickle.

Object collectives (through MPI, the job's store or the process group) carry small values: host names,
outcomes, figures, a checkpoint's per-rank state. A pickle would run whatever a forged value says the
moment it is read, so values travel as JSON (str-keyed dicts, lists, strings, numbers, booleans,
None) or, when they hold tensors or non-string keys, in torch's weights-only format, whose reader
builds tensors and containers and refuses anything else. A value that is neither is refused with
an error naming where it came from, and nothing of it runs.
"""

from __future__ import annotations

import io
import json
from typing import Any

from .errors import UserError

JSON, TENSORS = b"J", b"T"


def _plain(value: Any) -> bool:
    """Whether JSON carries `value` whole (tuples come back as lists)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item) for key, item in value.items())
    return False


def encode(value: Any) -> bytes:
    if _plain(value):
        return JSON + json.dumps(value, separators=(",", ":")).encode()
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return TENSORS + buffer.getvalue()


def decode(data: bytes, where: str) -> Any:
    """The value `data` holds; a UserError naming `where` for anything this project did not write."""
    data = bytes(data)
    try:
        if data[:1] == JSON:
            return json.loads(data[1:].decode())
        if data[:1] == TENSORS:
            import torch

            return torch.load(io.BytesIO(data[1:]), map_location="cpu", weights_only=True)
        reason = f"it starts with {data[:8]!r}, not a value of this project"
    except Exception as error:  # noqa: BLE001 - whatever the readers make of a forged value: one refusal
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    raise UserError(f"the value under {where} is garbled or forged ({reason}); it was refused and nothing of it ran. "
                    f"Something other than this job's ranks wrote to its rendezvous store or connections: run jobs on "
                    f"a network you trust (see the README's security section).", collective=False)
