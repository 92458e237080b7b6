"""Shared test helpers: launching real mpirun jobs of this package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Open MPI refuses root without these, and 4 ranks on a 2-core machine must not be bound to cores.
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_hwloc_default_binding_policy": "none",
    "PYTHONUNBUFFERED": "1",
}


def mpirun(np: int, args: list[str], *, module: str = "mpi_train", timeout: float = 240,
           env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `python -m module args` under a real `mpirun -np N` and return the finished process."""
    command = ["mpirun", "-np", str(np), "--oversubscribe", sys.executable, "-m", module, *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO,
        env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO), **(env or {})},
    )


def train(np: int, tmp_path: Path, *args: str, name: str = "summary", **kwargs) -> dict:
    """A real training job; returns its summary JSON (asserting the job succeeded)."""
    summary = tmp_path / f"{name}.json"
    result = mpirun(np, [*args, "--summary-json", str(summary)], **kwargs)
    assert result.returncode == 0, f"mpirun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return json.loads(summary.read_text())


def losses(summary: dict) -> list[float]:
    return [step["loss"] for step in summary["steps"]]


@pytest.fixture
def quick_args() -> list[str]:
    """A run of a few seconds: small synthetic MNIST-shaped data."""
    return ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "2"]
