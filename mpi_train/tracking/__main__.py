"""The run guard's process (`python -m mpi_train.tracking`, started by RunGuard)."""

import sys

from . import _guard_main

sys.exit(_guard_main())
