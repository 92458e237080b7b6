"""What a job turned out to be once set up, beside the configuration it was asked for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class JobInfo:
    """What a job turned out to be once set up (ranks, hosts, backend, steps): reported, logged and summarised."""

    world_size: int
    backend: str
    hosts: tuple[str, ...]
    threads: int
    rendezvous: str
    batch_size_per_rank: int
    steps_per_epoch: int
    total_steps: int
    compression: str = "none"  # the compression in effect (fp16 for flat_fp16)
    num_hosts: int = 1
    ranks_per_host: int = 1  # the most ranks on one host
    resumed_from: dict | None = None  # checkpoint, step, run id and world size of the job this one continues
    advice: dict | None = None  # under --sync auto: the advice followed (its file, age, the flags it set and why)
    data_path: str = ""  # the data path that runs and what it holds per rank (data/loaders.py)
    precision: str = "32-true"  # the --precision it runs at, auto resolved on its device (step/precision.py)
    # what the job runs as asked but not as meant, said under its first line: a mixed precision this CPU has no
    # arithmetic for (step/precision.py), a training set smaller than one global batch
    warnings: tuple[str, ...] = ()
    compile_s: float | None = None  # under --compile: the setup's compile, the slowest rank's (step/compiling.py)
    overlap_lost_to_compile: str | None = None  # under --compile: what the method's overlap loses (its traits')
    untrained_parameters: tuple[str, ...] = ()  # the model's trainable parameters no logit depends on (models/)

    def as_dict(self) -> dict:
        """The summary's job fields, in this order; `resumed_from` only when resumed, `advice` only under --sync
        auto, `compile_s` only under --compile, what that costs the method's overlap only where it costs, and the
        parameters no step trains only where there are some."""
        fields = {**dataclasses.asdict(self), "hosts": list(self.hosts),
                  "untrained_parameters": list(self.untrained_parameters) or None}
        for optional in ("resumed_from", "advice", "compile_s", "overlap_lost_to_compile", "untrained_parameters"):
            if fields[optional] is None:
                del fields[optional]
        return fields
