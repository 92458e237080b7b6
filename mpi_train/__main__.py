"""`python -m mpi_train [SUBCOMMAND] ...` is the `mpi-train` command (mpi_train/cli.py)."""

from .cli import console_main

console_main()
