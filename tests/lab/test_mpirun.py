"""Launches made from Python survive what killed mpiruns leave behind, and leave nothing themselves."""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import MPI_ENV, wait_for

from mpi_train.lab import mpirun as launch

pytestmark = pytest.mark.e2e

# A local rank's parent is mpirun: its pid names the session folder, ompi.<pid>, in the launch's TMPDIR.
SESSION_OF_MPIRUN = ["mpirun", "-np", "1", "--oversubscribe", "sh", "-c",
                     'echo "$TMPDIR $PPID"; ls -d "$TMPDIR"/ompi.*']


def test_a_launch_keeps_its_session_files_in_a_tmpdir_of_its_own_removed_after_it():
    """Why stale session files of a killed mpirun cannot stop a launch: Open MPI looks for them under $TMPDIR
    only, and each launch has a fresh one, so no folder left in the system temp dir is ever in its way."""
    result = launch.run(SESSION_OF_MPIRUN, env={**os.environ, **MPI_ENV}, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    first, *listed = result.stdout.split("\n")
    tmpdir, mpirun_pid = first.split()
    assert Path(tmpdir) != Path(tempfile.gettempdir()) and Path(tmpdir).name.startswith("mpirun-")
    assert f"{tmpdir}/ompi.{mpirun_pid}" in listed  # mpirun's own session folder, inside the launch's TMPDIR
    assert not Path(tmpdir).exists()  # removed with the launch


def test_stop_ends_mpirun_and_its_ranks_and_leaves_no_session_files():
    marker = f"{time.time_ns()}"
    with launch.own_tmpdir() as tmp_env:
        tmpdir = Path(tmp_env["TMPDIR"])
        job = launch.start(["mpirun", "-np", "2", "--oversubscribe", sys.executable, "-c",
                            f"import time; time.sleep(300)  # {marker}"],
                           {**os.environ, **MPI_ENV, **tmp_env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        def session_files() -> list:  # mpirun is up once its session files are there
            assert job.poll() is None, "mpirun ended at once"
            return list(tmpdir.glob("ompi.*"))

        wait_for(session_files, 30, "mpirun to start", every_s=0.1)
        launch.stop(job, grace_s=0.5)
        assert job.returncode is not None
    ranks = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout.split()
    assert ranks == [], f"ranks outlived the stop: {ranks}"
    assert not tmpdir.exists()
