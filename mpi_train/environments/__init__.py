"""Cluster environments: which launcher started this process, and what it says about the job.

ENVIRONMENTS is keyed by the --launcher names. `choose` picks one (auto: torchrun's
variables, then an MPI launcher's, then a Slurm step's; with none, MPI, which starts as
a singleton without a launcher). `check_world` refuses a job that found fewer ranks than
a launcher started: those processes would each train alone, as N separate jobs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import UserError
from .base import ClusterEnvironment, ObjectChannel
from .mpi import MpiEnvironment
from .slurm import SlurmEnvironment
from .torchrun import TorchrunEnvironment

ENVIRONMENTS: dict[str, type[ClusterEnvironment]] = {
    "mpi": MpiEnvironment,
    "torchrun": TorchrunEnvironment,
    "slurm": SlurmEnvironment,
}
LAUNCHERS = ("auto", *ENVIRONMENTS)
DETECTION_ORDER = ("torchrun", "mpi", "slurm")  # torchrun or mpirun inside a Slurm step still rule the ranks

# Variables in which a launcher states how many processes it started, and who sets them.
WORLD_SIZE_VARIABLES = {
    "WORLD_SIZE": "torchrun", "OMPI_COMM_WORLD_SIZE": "Open MPI's mpirun",
    "PMI_SIZE": "a PMI launcher (mpiexec, srun --mpi=pmi2)",
    "MV2_COMM_WORLD_SIZE": "MVAPICH's mpirun", "SLURM_STEP_NUM_TASKS": "srun",
}


def detect(env: Mapping[str, str] = os.environ) -> str:
    """The --launcher name that applies to a process with these variables."""
    for name in DETECTION_ORDER:
        if ENVIRONMENTS[name].detect(env):
            return name
    return "mpi"


def choose(launcher: str, env: Mapping[str, str] = os.environ, timeout_s: float = 300.0) -> ClusterEnvironment:
    """The environment for --launcher (auto: detected), not yet connected; the ranks wait `timeout_s` (--timeout)
    for each other to meet (MPI's launcher has them all started when it starts any)."""
    if launcher not in LAUNCHERS:
        raise UserError(f"--launcher {launcher!r} is unknown; choose one of {', '.join(LAUNCHERS)}.")
    name = detect(env) if launcher == "auto" else launcher
    return ENVIRONMENTS[name](env, timeout_s=timeout_s)


def check_world(found: int, launcher: str, env: Mapping[str, str] = os.environ) -> None:
    """Stop if any launcher's variables say more processes were started than the job found."""
    for variable, setter in WORLD_SIZE_VARIABLES.items():
        value = env.get(variable, "")
        if value.isdigit() and int(value) > found:
            alone = (f"each process would train alone, as {value} separate jobs" if found == 1 else
                     "the job would leave out processes that launcher started, or count ones it did not")
            raise UserError(
                f"{variable}={value} says {setter} started {value} processes, but the {launcher} launcher found "
                f"{found} rank(s) in this job: {alone}. "
                f"Pick the launcher that started the job with --launcher ({', '.join(ENVIRONMENTS)}; auto detects it), "
                f"or, for mpirun, use an mpi4py built against that mpirun's MPI library; if no such launcher started "
                f"it, {variable} is left over from elsewhere (a shell's exports, a batch script): unset it."
            )


__all__ = ["ENVIRONMENTS", "LAUNCHERS", "ClusterEnvironment", "ObjectChannel", "check_world", "choose", "detect"]
