"""`python -m mpi_train.bench` runs mpi_train/commands/bench.py (a rank program: it ends through
cluster.exit_process)."""

from .cluster import exit_process
from .commands.bench import main

if __name__ == "__main__":
    exit_process(main())
