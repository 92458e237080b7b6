"""`python -m mpi_train.bench_timeline` runs mpi_train/lab/bench_timeline.py."""

import sys

from .lab.bench_timeline import main

if __name__ == "__main__":
    sys.exit(main())
