"""`python -m mpi_train.advise_check` runs mpi_train/lab/advise_check.py."""

import sys

from .lab.advise_check import main

if __name__ == "__main__":
    sys.exit(main())
