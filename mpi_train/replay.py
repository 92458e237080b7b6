"""`python -m mpi_train.replay` runs mpi_train/tracking/replay.py."""

import sys

from .tracking.replay import main

if __name__ == "__main__":
    sys.exit(main())
