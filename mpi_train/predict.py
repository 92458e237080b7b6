"""`python -m mpi_train.predict` runs mpi_train/analysis/predict.py."""

import sys

from .analysis.predict import main

if __name__ == "__main__":
    sys.exit(main())
