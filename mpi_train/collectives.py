"""`python -m mpi_train.collectives` runs mpi_train/tools/collectives.py."""

from .cluster import exit_process
from .tools.collectives import main

if __name__ == "__main__":
    exit_process(main())
