"""Run under mpirun: several short training jobs one after another in the same ranks, each writing its summary
to OUT/<name>.json. One mpirun for all: starting ranks (and importing torch on each) costs more than the jobs'
few steps.

    mpirun -np 4 python -m tests.jobs_run OUT JOBS.json    # JOBS.json: {"name": [args...], ...}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mpi_train.cluster import Cluster, exit_process
from mpi_train.commands.train import parse_config
from mpi_train.train import run


def main(out: str, jobs: str) -> None:
    cluster = Cluster.from_mpi()
    for name, args in json.loads(Path(jobs).read_text()).items():
        argv = [*args, "--summary-json", str(Path(out) / f"{name}.json")]
        run(parse_config(argv, quiet=not cluster.info.is_main), cluster)


if __name__ == "__main__":
    main(*sys.argv[1:])
    exit_process(0)  # as `python -m mpi_train` does: interpreter teardown can abort under Gloo's threads
