"""mpi_train: data-parallel PyTorch training launched by mpirun, comparing gradient-sync methods."""

__version__ = "0.1.0"
