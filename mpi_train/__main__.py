"""`python -m mpi_train` trains (mpi_train/commands/train.py; a rank program: it ends through cluster.exit_process)."""

from .cluster import exit_process
from .commands.train import main

exit_process(main())
