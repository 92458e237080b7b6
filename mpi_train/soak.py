"""`python -m mpi_train.soak` runs mpi_train/lab/soak.py."""

import sys

from .lab.soak import main

if __name__ == "__main__":
    sys.exit(main())
