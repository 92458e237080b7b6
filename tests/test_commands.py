"""The console commands of pyproject's [project.scripts] exist and run their tool (after pip install)."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import REPO, MPI_ENV

SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_tool_has_a_command():
    assert {"mpi-train", "mpi-train-experiment", "mpi-train-bench", "mpi-train-collectives", "mpi-train-compare",
            "mpi-train-server", "mpi-train-replay", "mpi-train-bench-tracking"} <= set(SCRIPTS)


@pytest.mark.parametrize("command", sorted(SCRIPTS))
def test_a_command_runs_its_tool(command):
    path = Path(sys.executable).parent / command
    if not path.exists():
        pytest.fail(f"{path} is missing: install the package (pip install -e .) so pip writes its commands")
    result = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**os.environ, **MPI_ENV})
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.e2e
def test_mpi_train_command_trains_under_mpirun(tmp_path):
    command = Path(sys.executable).parent / "mpi-train"
    result = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", str(command), "--dataset", "synthetic",
                             "--synthetic-size", "256", "--batch-size", "64", "--max-steps", "2", "--no-tracking"],
                            capture_output=True, text=True, timeout=240, cwd=tmp_path, env={**os.environ, **MPI_ENV})
    assert result.returncode == 0, result.stderr
    assert "2 rank(s) on 1 host(s)" in result.stdout and "done in" in result.stdout
