"""`python -m mpi_train.experiment` runs mpi_train/lab/experiment.py."""

import sys

from .lab.experiment import main

if __name__ == "__main__":
    sys.exit(main())
