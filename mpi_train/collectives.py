"""`python -m mpi_train.collectives` runs mpi_train/commands/collectives.py (a rank program: it ends through
cluster.exit_process)."""

from .cluster import exit_process
from .commands.collectives import main

if __name__ == "__main__":
    exit_process(main())
