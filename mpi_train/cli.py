"""The one command, `mpi-train` or `python -m mpi_train`, and its subcommands: each a module's `main(argv)`.

    mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter     # a flag first: train
    mpi-train                                                                       # nothing: this help
    mpirun -np 4 --hostfile hostfile python -m mpi_train bench --steps 20
    python -m mpi_train experiment experiments/smoke.toml

A subcommand's module is imported only when it runs, so `mpi-train --help` lists them without importing torch.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from . import __version__
from .errors import format_error


@dataclass(frozen=True)
class Subcommand:
    module: str  # holds main(argv) -> exit status
    summary: str  # its line in `mpi-train --help`
    rank: bool = False  # started on every rank by mpirun: it ends through cluster.exit_process
    lab: bool = False  # the project's own self-checks, listed apart from the user's commands


SUBCOMMANDS = {  # name: the module whose main(argv) runs it, its line in --help
    "train": Subcommand("mpi_train.commands.train", "train a model data-parallel (the default when a flag comes "
                        "first)", rank=True),
    "compare": Subcommand("mpi_train.analysis.compare", "the finished jobs of an experiment side by side, as a table "
                          "and as plots"),
    "experiment": Subcommand("mpi_train.lab.experiment", "run every configuration of an experiment file with "
                             "mpirun, then report"),
    "predict": Subcommand("mpi_train.analysis.predict", "each sync method's step time and memory per rank on a "
                          "cluster you do not have, from the model"),
    "advise": Subcommand("mpi_train.commands.advise", "which sync method to run on these hosts, predicted, measured, "
                         "and kept for --sync auto", rank=True),
    "bench": Subcommand("mpi_train.commands.bench", "what each sync method costs, measured side by side and held "
                        "against its cost model", rank=True),
    "collectives": Subcommand("mpi_train.commands.collectives", "cluster check: every collective the sync methods "
                              "use, against its closed form", rank=True),
    "server": Subcommand("mpi_train.tracking.server", "an MLflow tracking server on this project's store"),
    "replay": Subcommand("mpi_train.tracking.replay", "send to MLflow what jobs spooled while its server was "
                         "unreachable"),
    "supervise": Subcommand("mpi_train.lab.supervise", "relaunch a failed job from its last checkpoint, into the same "
                            "MLflow run; shrink it off a host gone and grow it back"),
    "gpu-check": Subcommand("mpi_train.commands.gpu_check", "a GPU machine's check: every method under NCCL, the "
                            "step against a bare loop, exact resumption, one real epoch", rank=True),
    "soak": Subcommand("mpi_train.lab.soak", "short jobs on test hosts, one random fault each, and what it did",
                     lab=True),
    "advise-check": Subcommand("mpi_train.lab.advise_check", "the advisor held against a full bench on test hosts",
                               lab=True),
    "bench-timeline": Subcommand("mpi_train.lab.bench_timeline", "what the sync split and the timeline measure, and "
                                 "what they cost", lab=True),
    "bench-data": Subcommand("mpi_train.lab.bench_data", "the two data paths' training images/s side by side on one "
                             "CPU thread", lab=True),
    "bench-tracking": Subcommand("mpi_train.lab.bench_tracking", "what experiment tracking costs a training step",
                                 lab=True),
}
DEFAULT = "train"  # what a first argument that is a flag runs; no argument at all prints the help


def usage() -> str:
    width = max(map(len, SUBCOMMANDS)) + 2

    def listed(lab: bool) -> str:
        return "\n".join(f"  {name:<{width}}{sub.summary}" for name, sub in SUBCOMMANDS.items() if sub.lab == lab)

    return (f"usage: mpi-train SUBCOMMAND [options]   (or python -m mpi_train SUBCOMMAND [options])\n\n"
            f"Data-parallel training under mpirun, comparing gradient-sync methods, tracked in MLflow.\n\n"
            f"subcommands:\n{listed(False)}\n\n"
            f"the lab's self-checks (on test hosts or this machine):\n{listed(True)}\n\n"
            f"`mpi-train SUBCOMMAND --help` gives a subcommand's options; `mpi-train --version` the version. A flag "
            f"first means {DEFAULT}:\n"
            f"  mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter\n")


def split(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(subcommand, its arguments) of a non-empty argv; an unknown name raises KeyError."""
    if argv[0].startswith("-"):
        return DEFAULT, list(argv)
    if argv[0] not in SUBCOMMANDS:
        raise KeyError(argv[0])
    return argv[0], list(argv[1:])


HELP = ([], ["-h"], ["--help"])  # nothing at all asks for help too: a bare command never starts a job
VERSION = (["-V"], ["--version"])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand argv names and return its exit status (console_main ends the process)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in HELP:
        print(usage(), end="")
        return 0
    if argv[:1] in VERSION:
        print(f"mpi-train {__version__}")
        return 0
    try:
        name, rest = split(argv)
    except KeyError:
        print(format_error(f"no subcommand {argv[0]!r}; the subcommands are {', '.join(SUBCOMMANDS)} (a flag first "
                           f"means {DEFAULT}; mpi-train --help says what each does).", prog="mpi-train"),
              file=sys.stderr)
        return 2
    return importlib.import_module(SUBCOMMANDS[name].module).main(rest)


def is_rank_program(argv: Sequence[str]) -> bool:
    try:
        return argv[:1] not in HELP + VERSION and SUBCOMMANDS[split(argv)[0]].rank
    except KeyError:
        return False


def console_main() -> None:
    """The `mpi-train` command and `python -m mpi_train`: a rank program ends through exit_process, the rest exit."""
    argv = sys.argv[1:]
    for name in ("stdout", "stderr"):  # a stream the shell closed (`>&-`): written nowhere, as print already does
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - the process's own stream, for its whole life
    code = main(argv)
    if is_rank_program(argv):
        # here, not at the top: cluster imports torch, which --help and the lab's subcommands need not wait for
        from .cluster import exit_process

        exit_process(code)
    sys.exit(code)
