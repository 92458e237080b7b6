"""`python -m mpi_train.bench_tracking` runs mpi_train/lab/bench_tracking.py."""

import sys

from .lab.bench_tracking import main

if __name__ == "__main__":
    sys.exit(main())
