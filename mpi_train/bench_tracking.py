"""`python -m mpi_train.bench_tracking` runs mpi_train/tools/bench_tracking.py."""

import sys

from .tools.bench_tracking import main

if __name__ == "__main__":
    sys.exit(main())
