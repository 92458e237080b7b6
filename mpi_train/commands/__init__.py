"""Rank programs launched like training (`mpirun ... python -m mpi_train.bench`): the cost bench and the cluster check.

They import the rank package and nothing from lab/ or analysis/ (tests/test_layout.py checks it).
"""
