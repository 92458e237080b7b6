"""`python -m mpi_train.compare` runs mpi_train/analysis/compare.py."""

import sys

from .analysis.compare import main

if __name__ == "__main__":
    sys.exit(main())
