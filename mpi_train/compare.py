"""`python -m mpi_train.compare` runs mpi_train/tools/compare.py."""

import sys

from .tools.compare import main

if __name__ == "__main__":
    sys.exit(main())
