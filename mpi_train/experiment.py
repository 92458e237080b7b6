"""`python -m mpi_train.experiment` runs mpi_train/tools/experiment.py."""

import sys

from .tools.experiment import main

if __name__ == "__main__":
    sys.exit(main())
