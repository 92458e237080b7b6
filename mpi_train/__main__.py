"""`python -m mpi_train` trains (mpi_train/cli.py; a rank program: it ends through cluster.exit_process)."""

from .cli import main
from .cluster import exit_process

exit_process(main())
