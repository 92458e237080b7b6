"""`python -m mpi_train.advise` runs mpi_train/commands/advise.py (a rank program: it ends through
cluster.exit_process)."""

from .cluster import exit_process
from .commands.advise import main

if __name__ == "__main__":
    exit_process(main())
