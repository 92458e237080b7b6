"""`python -m mpi_train.bench` runs mpi_train/tools/bench.py."""

from .cluster import exit_process
from .tools.bench import main

if __name__ == "__main__":
    exit_process(main())
