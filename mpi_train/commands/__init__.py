"""Rank programs, started by mpirun on every rank (`mpirun ... python -m mpi_train bench`): training's flags (train.py),
the cost bench, the advisor and the cluster check. mpi_train/cli.py names each as a subcommand.

They import the rank package and nothing from lab/ or analysis/ (tests/test_layout.py checks it).
"""
