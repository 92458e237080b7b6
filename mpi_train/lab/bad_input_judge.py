"""How a run of a `soak --bad-input` case is launched and judged: the standard every fault a user can cause is held to.

A run must exit non-zero (a warning: exit 0 and say it), print no line with "Traceback", name
the cause, leave nothing running and nothing half-written, all within its timeout. `launch` runs
a command as a user would, in the case's folder, and gathers what the rules read; `judge` says
which rules a run breaks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Container
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoint import NAME_PATTERN, read_checkpoint
from ..data import cache
from . import mpirun

REPO = Path(__file__).resolve().parents[2]
SETTLE_S = 5.0  # what a launch's end leaves to exit on its own, at most
MESSAGE_LINE = re.compile(r"(?i)(error|warning|exception)\s*:")
STOP = threading.Event()  # set on Ctrl-C: the launches still running are stopped and cleaned up as a hang's are


@dataclass
class Run:
    """One launch of a case: its exit status (None: stopped at the timeout), output, seconds, and what it left."""

    exit: int | None
    output: str
    seconds: float
    left: list[str] = field(default_factory=list)  # its processes alive after it ended
    half_written: list[str] = field(default_factory=list)


def message(output: str) -> str:
    """The first line of what the run said went wrong: its first error or warning line, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return next((line for line in lines if MESSAGE_LINE.search(line)), lines[-1] if lines else "")


def paragraph(output: str) -> str:
    """The message's paragraph, from its first line to the next blank or ruled line."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if MESSAGE_LINE.search(line)), len(lines))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip() or lines[i].startswith("---")), len(lines))
    return " ".join(" ".join(lines[start:end]).split())


def judge(run: Run, causes: tuple[str, ...], warning: bool = False) -> list[str]:
    """The rules of the standard that `run` breaks: HANG, EXIT, TRACEBACK, CAUSE NOT NAMED (NO WARNING), LEFT
    RUNNING, HALF-WRITTEN."""
    problems = []
    if run.exit is None:
        problems.append("HANG")
    elif (run.exit != 0) == warning:  # an error must stop the job; a warning must not
        problems.append(f"EXIT {run.exit}")
    if any("Traceback" in line for line in run.output.splitlines()):
        problems.append("TRACEBACK")
    text = " ".join(run.output.split())  # a paragraph wrapped for the terminal reads as one line again
    if not all(re.search(cause, text, re.IGNORECASE) for cause in causes):
        problems.append("NO WARNING" if warning else "CAUSE NOT NAMED")
    if run.left:
        problems.append("LEFT RUNNING")
    if run.half_written:
        problems.append("HALF-WRITTEN")
    return problems


def processes_of(folder: Path, mpirun_pid: int | None = None) -> list[str]:
    """`PID COMMAND` of each process of the case: working in its folder or naming it, or a launch daemon of its
    mpirun (prted names mpirun's job as prterun-HOST-PID@N)."""
    daemon = re.compile(rf"(^|/)prted .*-{mpirun_pid}@\d") if mpirun_pid else None
    inside = str(folder.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone meanwhile, or a zombie
            continue
        if cwd == inside or cwd.startswith(inside + "/") or inside in args or daemon and daemon.search(args):
            found.append(f"{entry.name} {args[:120]}")
    return found


def end_processes(found: list[str]) -> None:
    for line in found:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def folders(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_dir() and not path.is_symlink()}


def half_written(root: Path, before: set[Path], damaged: Container[Path] = frozenset()) -> list[str]:
    """What a run left half-done under `root`: *.partial files, folders it created and left without a file, and
    checkpoints or data caches that cannot be read (not those in `damaged`, broken on purpose)."""
    found, empty = [], []
    for path in sorted(root.rglob("*")):
        where = path.relative_to(root)
        if path.name.endswith(".partial"):
            found.append(f"{where} (a .partial file)")
        elif path.is_dir() and path not in before and not any(inner.is_file() for inner in path.rglob("*")):
            if not any(parent in empty for parent in path.parents):
                empty.append(path)
                found.append(f"{where}/ (an empty folder)")
        elif path in damaged or not path.is_file():
            continue
        elif NAME_PATTERN.match(path.name) and unreadable(read_checkpoint, path):
            found.append(f"{where} (a checkpoint that cannot be read)")
        elif path.parent.name == cache.CACHE_FOLDER and path.suffix == ".pt" and unreadable(cache.load, path):
            found.append(f"{where} (a damaged data cache)")
    return found


def unreadable(read: Callable[[Path], object], path: Path) -> bool:
    try:
        read(path)
    except Exception:  # noqa: BLE001 - whatever reading a broken file raises, it is broken
        return True
    return False


def launch(command: list[str], folder: Path, timeout_s: float, damaged: Container[Path] = frozenset()) -> Run:
    """Run `command` in `folder` (mpirun's own TMPDIR, the checkout first on the path), stopped at `timeout_s`; then
    find what it left running (ended afterwards) and half-written."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the store of the case's folder
    env.update(mpirun.OPEN_MPI_ENV, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    before, lines = folders(folder), []
    with ExitStack() as stack:
        env.update(stack.enter_context(mpirun.own_tmpdir()))
        started = time.monotonic()
        process = mpirun.start(command, env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, errors="replace")
        stack.callback(lambda: end_processes(processes_of(folder, process.pid)))  # every way out, Ctrl-C included
        stack.callback(mpirun.stop, process)
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        deadline = started + timeout_s
        while (code := process.poll()) is None and time.monotonic() < deadline and not STOP.is_set():
            time.sleep(0.1)
        if code is None:
            mpirun.stop(process)
        seconds = time.monotonic() - started
        deadline = time.monotonic() + SETTLE_S
        while (left := processes_of(folder, process.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        end_processes(left)
        reader.join(5)  # a process left behind may hold the pipe open until it is ended
    return Run(exit=code, output="".join(lines), seconds=seconds, left=left,
               half_written=half_written(folder, before, damaged))
