"""Run under mpirun: one short training job per sync method that sends gradients uncompressed, one after
another in the same ranks, each writing its summary to OUT/<sync>.json (tests/test_randomness.py runs
this twice and compares the losses bit for bit). One mpirun for all: starting ranks costs more than
the jobs' few steps.

    mpirun -np 2 python -m tests.rank_programs.methods_run OUT ARGS...
"""

from __future__ import annotations

import sys
from pathlib import Path

from mpi_train.cluster import Cluster, exit_process
from mpi_train.commands.train import parse_config
from mpi_train.sync import SYNC_METHODS, backend_error
from mpi_train.train import run

UNCOMPRESSED = [name for name, method in SYNC_METHODS.items()
                if method.traits.fixed_compression in (None, "none") and not backend_error(name, "gloo")]


def main(out: str, *args: str) -> None:
    cluster = Cluster.from_mpi()
    for sync in UNCOMPRESSED:
        argv = [*args, "--sync", sync, "--summary-json", str(Path(out) / f"{sync}.json")]
        run(parse_config(argv, quiet=not cluster.info.is_main), cluster)


if __name__ == "__main__":
    main(*sys.argv[1:])
    exit_process(0)  # as `python -m mpi_train` does: interpreter teardown can abort under Gloo's threads
