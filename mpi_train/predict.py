"""`python -m mpi_train.predict` runs mpi_train/tools/predict.py."""

import sys

from .tools.predict import main

if __name__ == "__main__":
    sys.exit(main())
