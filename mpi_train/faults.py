"""`python -m mpi_train.faults soak` is `python -m mpi_train.soak` (mpi_train/lab/soak.py), by its older name."""

import sys

from .lab.soak import main

if __name__ == "__main__":
    if sys.argv[1:2] != ["soak"]:
        sys.exit("usage: python -m mpi_train.faults soak [options], the same as python -m mpi_train.soak [options]")
    sys.exit(main(sys.argv[2:]))
