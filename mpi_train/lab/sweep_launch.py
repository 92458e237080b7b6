"""Running one mpirun of a sweep: its log, its progress lines with the time left, and why it failed."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .mpirun import own_tmpdir, start, stop
from .network import NetworkSetting

STEP_LINE = re.compile(r"step\s+(\d+)/(\d+)")  # training's and the bench's progress lines
UNBUFFERED_ENV = {"PYTHONUNBUFFERED": "1"}  # progress lines must arrive as they are printed


@dataclass
class Launch:
    """One mpirun of the sweep: a training run or the bench."""

    index: int
    name: str
    command: list[str]
    steps: int
    log: Path
    env: dict = field(default_factory=dict)
    network: NetworkSetting | None = None  # the hosts and link it runs on ([network] table)
    calibration: Path | None = None  # a bench JSON whose links predict its sync, passed if the bench wrote it
    returncode: int | None = None
    seconds: float = 0.0
    steps_done: int = 0
    error: str = ""
    first: tuple[float, int] | None = None  # (seconds since start, step) of its first progress line
    last: tuple[float, int] | None = None  # and of its latest

    def seconds_per_step(self) -> float | None:
        """Its pace between progress lines: start-up (imports, data, rendezvous) excluded."""
        if self.first and self.last and self.last[1] > self.first[1]:
            return (self.last[0] - self.first[0]) / (self.last[1] - self.first[1])
        return None

    def startup(self) -> float | None:
        """Seconds before its first step: the part of a run that does not scale with steps."""
        pace = self.seconds_per_step()
        return max(0.0, self.first[0] - self.first[1] * pace) if pace is not None else None


def duration(seconds: float) -> str:
    """12s, 3m05s, 1h02m: as long as the console line needs."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Which run of how many, its step, the elapsed time and an estimate of the time left."""

    def __init__(self, launches: list[Launch]):
        self.launches = launches
        self.started = time.monotonic()

    def estimate_left(self, current: Launch) -> float | None:
        """The current run's steps at its own pace, then each later run as start-up plus steps at the pace seen
        so far."""
        finished = [l for l in self.launches if l.returncode == 0 and l.seconds_per_step() is not None]
        paces = [l.seconds_per_step() for l in finished]
        mean_pace = sum(paces) / len(paces) if paces else None
        pace = current.seconds_per_step() or mean_pace
        if pace is None:
            return None
        if mean_pace is None:
            mean_pace = pace
        startups = [l.startup() for l in finished] or [current.startup() or 0.0]
        startup = sum(startups) / len(startups)
        later = [l for l in self.launches if l.index > current.index]
        return max(0, current.steps - current.steps_done) * pace + sum(startup + l.steps * mean_pace for l in later)

    def line(self, current: Launch, run_elapsed: float) -> str:
        left = self.estimate_left(current)
        eta = f", ~{duration(left)} left (estimate)" if left is not None else ""
        return (f"[{current.index}/{len(self.launches)}] {current.name}: step {current.steps_done}/{current.steps}, "
                f"run {duration(run_elapsed)}, sweep {duration(time.monotonic() - self.started)}{eta}")


ONE_PARAGRAPH = re.compile(r"mpi_train[\w.]*: (error|warning)")  # an error of ours, wrapped over a few lines
FAILURE_LINES = (  # what says why a run failed, most telling first
    # the remote agent's own words when mpirun could not reach a host (`ssh: Could not resolve hostname h: ...`),
    # which the banner mpirun prints after them ("A daemon failed to report back") leaves out
    re.compile(r"^(ssh|rsh): \S"),
    re.compile(r"^\s*[\w.]*(Error|Exception|Interrupt)\b.*?:"),  # a traceback's last line
    ONE_PARAGRAPH,
    re.compile(r"(failed|Killed|killed|not found|refused|not enough slots)"),
)


BANNER = re.compile(r"^-{20,}$")  # how Open MPI frames a message of its own


def last_error(lines: list[str]) -> str:
    """The line that says why a run failed: the remote agent's error when a host could not be reached, the run's
    exception or error message, else the last line it printed."""
    for pattern in FAILURE_LINES:
        for index in range(len(lines) - 1, -1, -1):
            if pattern.search(lines[index]):
                if pattern is not ONE_PARAGRAPH:
                    return lines[index].strip()
                paragraph = [lines[index]]  # and its wrapped lines, up to a blank one or mpirun's banner
                for line in lines[index + 1:]:
                    if not line.strip() or line.startswith(("-", " ")) or ONE_PARAGRAPH.search(line):
                        break
                    paragraph.append(line)
                return " ".join(line.strip() for line in paragraph)
    return banner_text(lines) or next((line.strip(" \t\x00") for line in reversed(lines) if line.strip(" \t\x00")),
                                      "(no output)")


def banner_text(lines: list[str]) -> str | None:
    """The first paragraph of the last message Open MPI framed in lines of dashes, where the output ends with one
    (mpirun refusing a hostfile, say): the closing dashes say nothing."""
    framed = [index for index, line in enumerate(lines) if BANNER.match(line.strip())]
    if len(framed) < 2 or any(line.strip(" \t\x00") for line in lines[framed[-1] + 1:]):
        return None
    paragraph = []
    for line in lines[framed[-2] + 1:framed[-1]]:
        if line.strip():
            paragraph.append(line.strip())
        elif paragraph:
            break
    return " ".join(paragraph) or None


def execute(launch: Launch, progress: Progress, timeout: float | None) -> None:
    """Run one mpirun, logging its output and printing progress; never raises for a failed run."""
    launch.log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tail: list[str] = []
    print(f"[{launch.index}/{len(progress.launches)}] {launch.name}: starting", flush=True)
    command = launch.command
    if launch.calibration and launch.calibration.is_file():
        command = command + ["--calibration", str(launch.calibration)]
    with open(launch.log, "w") as log, own_tmpdir() as tmp_env:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        process = start(command, {**os.environ, **UNBUFFERED_ENV, **launch.env, **tmp_env},
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        timer = threading.Timer(timeout, _stop, (process, launch)) if timeout else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            for line in process.stdout:
                log.write(line)
                log.flush()
                tail = (tail + [line.rstrip("\n")])[-40:]
                match = STEP_LINE.search(line)
                if match:
                    launch.steps_done, launch.steps = int(match.group(1)), int(match.group(2))
                    launch.last = (time.monotonic() - started, launch.steps_done)
                    launch.first = launch.first or launch.last
                    print(progress.line(launch, launch.last[0]), flush=True)
            process.wait()
        except KeyboardInterrupt:
            _stop(process, launch, reason="interrupted")
            raise
        finally:
            if timer:
                timer.cancel()
    launch.seconds = time.monotonic() - started
    launch.returncode = process.returncode
    if process.returncode == 0:
        print(f"[{launch.index}/{len(progress.launches)}] {launch.name}: done in {duration(launch.seconds)}",
              flush=True)
    else:
        launch.error = launch.error or last_error(tail)
        print(f"[{launch.index}/{len(progress.launches)}] {launch.name}: FAILED (exit {process.returncode}) after "
              f"{duration(launch.seconds)}: {launch.error}\n    full output: {launch.log}", flush=True)


def _stop(process: subprocess.Popen, launch: Launch, reason: str = "") -> None:
    """End the run's whole process group (mpirun and its ranks)."""
    launch.error = reason or "stopped: it ran past [launch] timeout"
    stop(process)
