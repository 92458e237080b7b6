"""`python -m mpi_train.supervise` runs mpi_train/lab/supervise.py."""

import sys

from .lab.supervise import main

if __name__ == "__main__":
    sys.exit(main())
