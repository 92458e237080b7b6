"""`python -m mpi_train train` (or flags first, no subcommand): the training command's flags, built from TrainConfig,
run under the rank guard.

Launch line: mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from ..config import ENV_DEFAULTS, TrainConfig, add_config_arguments
from ..rankguard import RankAwareParser, guarded, join_job
from ..train import run


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    parser = RankAwareParser(
        prog="python -m mpi_train train", quiet=quiet,
        description="Data-parallel training under mpirun, comparing gradient-sync methods.",
        epilog="Launch with: mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter",
    )
    add_config_arguments(parser)
    return parser


def parse_config(argv: Sequence[str] | None, quiet: bool = False) -> TrainConfig:
    values = vars(build_parser(quiet).parse_args(argv))
    for name, variable in ENV_DEFAULTS.items():
        if values[name] is None and os.environ.get(variable):
            values[name] = os.environ[variable]
    return TrainConfig(**values)


def main(argv: Sequence[str] | None = None) -> int:
    cluster = join_job(argv)
    config = parse_config(argv, quiet=not cluster.info.is_main)
    return guarded(cluster, lambda: run(config, cluster), config.timeout)
