"""Run under mpirun: several short training jobs one after another in the same ranks, each writing its summary
to OUT/<name>.json (a job that stops with a UserError on every rank, as a diverged one does: {"error": its message}).
One mpirun for all: starting ranks (and importing torch on each) costs more than the jobs' few steps.

    mpirun -np 4 python -m tests.rank_programs.jobs_run OUT JOBS.json    # JOBS.json: {"name": [args...], ...}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mpi_train.cluster import Cluster, exit_process
from mpi_train.commands.train import parse_config
from mpi_train.errors import UserError
from mpi_train.train import run


def main(out: str, jobs: str) -> None:
    cluster = Cluster.from_mpi()
    for name, args in json.loads(Path(jobs).read_text()).items():
        argv = [*args, "--summary-json", str(Path(out) / f"{name}.json")]
        try:
            run(parse_config(argv, quiet=not cluster.info.is_main, cluster=cluster), cluster)
        except UserError as error:
            if not error.collective:  # raised on some ranks only: the others would wait for them in the next job
                raise
            if cluster.info.is_main:
                (Path(out) / f"{name}.json").write_text(json.dumps({"error": str(error)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
    exit_process(0)  # as `python -m mpi_train` does: interpreter teardown can abort under Gloo's threads
