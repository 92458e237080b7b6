"""`python -m mpi_train.server` runs mpi_train/tracking/server.py."""

import sys

from .tracking.server import main

if __name__ == "__main__":
    sys.exit(main())
