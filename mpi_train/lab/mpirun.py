"""Starting mpirun from Python, as the experiment runner, the benchmarks and the tests do.

Open MPI keeps each launch's session files in $TMPDIR/ompi.<pid of mpirun> and deletes them when
mpirun exits. An mpirun killed with SIGKILL leaves them behind, and a later mpirun that is given
the same pid dies at once with "The PMIx server's listener thread failed to start". So every launch
made here gets a temporary directory of its own, removed afterwards, and is stopped as a whole
process group (mpirun and its local ranks), never by killing mpirun alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

STOP_GRACE_S = 10.0  # between SIGTERM and SIGKILL; mpirun passes SIGTERM on to the ranks
# What Open MPI needs to run as root, and to start more ranks than cores without binding them;
# harmless otherwise. The benchmarks and the tests launch with it.
OPEN_MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_hwloc_default_binding_policy": "none",
}


@contextmanager
def own_tmpdir() -> Iterator[dict[str, str]]:
    """Environment for one launch: a fresh TMPDIR, removed with whatever was left in it when the launch is over."""
    folder = tempfile.mkdtemp(prefix="mpirun-")
    try:
        yield {"TMPDIR": folder}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def start(command: Sequence[str], env: Mapping[str, str], **popen_kwargs) -> subprocess.Popen:
    """Start a launch in its own process group, so that `stop` reaches its ranks too."""
    return subprocess.Popen(list(command), env=dict(env), start_new_session=True, **popen_kwargs)


def stop(process: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """End a launch: SIGTERM to its process group, SIGKILL if it is still there after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def launched(command: Sequence[str], env: Mapping[str, str], **popen_kwargs) -> Iterator[subprocess.Popen]:
    """A launch with its own TMPDIR, for the length of a `with`: on leaving it (an error or Ctrl-C included)
    whatever is left of the launch is stopped and its TMPDIR removed."""
    with own_tmpdir() as tmp_env:
        process = start(command, {**env, **tmp_env}, **popen_kwargs)
        try:
            yield process
        finally:
            stop(process)


def run(command: Sequence[str], env: Mapping[str, str] | None = None, timeout: float | None = None,
        cwd=None) -> subprocess.CompletedProcess:
    """Run one launch to its end and capture its output (text).

    A launch that runs past `timeout` seconds is stopped and subprocess.TimeoutExpired is raised,
    carrying what it printed.
    """
    with launched(command, env if env is not None else os.environ, cwd=cwd,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(process)
            stdout, stderr = process.communicate()
            raise subprocess.TimeoutExpired(process.args, timeout, stdout, stderr) from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
