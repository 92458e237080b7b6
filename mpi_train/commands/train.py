"""`python -m mpi_train train` (or flags first, no subcommand): the job as its flags and job file give it
(config/command_line.py), run under the rank guard.

Launch line: mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..config.command_line import build_parser, parse_config
from ..errors import UserError, format_error
from ..rankguard import guarded, join_job
from ..train import run

__all__ = ["build_parser", "main", "parse_config"]


def main(argv: Sequence[str] | None = None) -> int:
    cluster = join_job(argv)
    try:
        config = parse_config(argv, quiet=not cluster.info.is_main, cluster=cluster)
    except UserError as error:  # a job file every rank refused alike (each holds rank 0's text): said once
        if cluster.info.is_main:
            print(format_error(str(error)), file=sys.stderr)
        return error.exit_code
    return guarded(cluster, lambda: run(config, cluster), config.timeout)
