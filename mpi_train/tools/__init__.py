"""The `python -m mpi_train.<name>` commands that are not training itself: experiment runner, comparison, benchmarks, collective checks."""
