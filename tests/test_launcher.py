"""Launches made from Python survive what killed mpiruns leave behind, and leave nothing themselves."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conftest import MPI_ENV
from mpi_train import launcher

MPIRUN_PPID = ["mpirun", "-np", "1", "--oversubscribe", "sh", "-c", "echo $PPID"]  # a local rank's parent is mpirun
AHEAD = 3000  # pids to cover: threads of other processes take pids too


def next_pids(count: int) -> list[int]:
    """The pids the kernel hands out next, in order (skipping those in use): below pid_max, then from 300 again."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return [pid if pid < pid_max else 300 + (pid - pid_max) % (pid_max - 300)
            for pid in range(os.getpid() + 1, os.getpid() + 1 + count)]


def leave_stale_session_dirs(pids: list[int]) -> list[Path]:
    """What an mpirun killed with SIGKILL leaves in the system temp dir, for each of these pids."""
    base = Path(tempfile.gettempdir())
    made = []
    for pid in pids:
        folder = base / f"ompi.{pid}"
        if folder.exists():
            continue
        folder.mkdir()
        made.append(folder)
        for name in ("pmix.vm.tool", f"pmix.vm.tool.{pid}", f"pmix.vm.tool.prterun-vm-{pid}@0"):
            (folder / name).write_text(f"prterun-vm-{pid}@0.0;tcp4://127.0.0.1:1\n")
    return made


def test_a_stale_session_dir_with_mpiruns_pid_does_not_stop_the_launch():
    pids = next_pids(AHEAD)
    made = leave_stale_session_dirs(pids)
    try:
        result = launcher.run(MPIRUN_PPID, env={**os.environ, **MPI_ENV}, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        mpirun_pid = int(result.stdout.split()[-1])
        assert mpirun_pid in pids, "mpirun's pid missed the stale dirs: the check proved nothing"
        assert Path(tempfile.gettempdir(), f"ompi.{mpirun_pid}").is_dir()
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def test_stop_ends_mpirun_and_its_ranks_and_leaves_no_session_files():
    marker = f"{time.time_ns()}"
    with launcher.own_tmpdir() as tmp_env:
        tmpdir = Path(tmp_env["TMPDIR"])
        job = launcher.start(["mpirun", "-np", "2", "--oversubscribe", sys.executable, "-c", f"import time; time.sleep(300)  # {marker}"],
                             {**os.environ, **MPI_ENV, **tmp_env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not list(tmpdir.glob("ompi.*")):  # mpirun is up once its session files are there
            assert job.poll() is None and time.monotonic() < deadline, "mpirun did not start"
            time.sleep(0.1)
        launcher.stop(job, grace_s=0.5)
        assert job.returncode is not None
    ranks = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert ranks == [], f"ranks outlived the stop: {ranks}"
    assert not tmpdir.exists()
