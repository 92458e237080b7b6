"""`python -m mpi_train train` (or flags first, no subcommand): the job as its flags and job file give it
(config/command_line.py), run under the rank guard.

Launch line: mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

from ..cluster import Cluster
from ..config import TrainConfig
from ..config.command_line import build_parser, parse_config
from ..errors import UserError
from ..files import release_claims
from ..loop.out_of_memory import said_in_one_paragraph
from ..rankguard import guarded, join_job, keep_unsaid, said_once
from ..train import run

__all__ = ["build_parser", "main", "parse_config"]


def refusal(argv: Sequence[str] | None) -> str:
    """What the parser, silent on this rank, said of these flags (after its `PROG: error: `)."""
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.suppress(SystemExit):
        build_parser(False).parse_args(argv)
    return " ".join(said.getvalue().partition(": error: ")[2].split())


def main(argv: Sequence[str] | None = None) -> int:
    cluster = join_job(argv)
    try:
        config = parse_config(argv, quiet=not cluster.info.is_main, cluster=cluster)
    except UserError as error:  # a job file every rank refused alike (each holds rank 0's text): said once
        return said_once(cluster, error)
    except SystemExit as refused:  # argparse's refusal, which rank 0's parser has printed (or --help: code 0)
        if not refused.code:
            raise
        keep_unsaid(cluster, "" if cluster.info.is_main else refusal(argv))  # in case its flags alone were bad
        return int(refused.code)
    try:
        return guarded(cluster, lambda: run_job(config, cluster), config.timeout)
    finally:  # the checkpoint folder the job claimed (reporter.check_outputs), removed if it was made for nothing
        release_claims()


def run_job(config: TrainConfig, cluster: Cluster) -> int:
    """The job; a rank out of memory says where, with what batch, and what to change (loop/out_of_memory.py)."""
    with said_in_one_paragraph(config, cluster):
        return run(config, cluster)
