"""Every signal handler a rank installs, in this one module (and the run guard's one, in its program: guard.WAIT).

- SIGTERM and SIGINT on rank 0: the job's runs end KILLED, from a helper thread (StopWatch).
- SIGTERM on the other ranks under srun or torchrun: wait for rank 0 to record the end (tracker.RankTracker).
- SIGUSR1 with --checkpoint-dir: checkpoint at the next step boundary and stop for requeue (preemption.py); once
  the end is recorded, SIGTERM is ignored so that the ranks leave together. Under torchrun's agent, SIGTERM too
  (the agent restarts the workers at a new size); the handlers above then act only if the ranks do not stop in time.
- SIGINT in the guard process: ignored, so that a Ctrl-C meant for the job leaves the guard to record its end (set
  in guard.WAIT, which runs before anything of this package is imported).

It lives in tracking/ because what a signal changes first is how the job's runs end. One module shows which handler a
process holds at each moment, and that each handler put in place is put back.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

TERMINATE, INTERRUPT = signal.SIGTERM, signal.SIGINT
STOPPING = (TERMINATE, INTERRUPT)  # a launcher's or a user's stop: the runs end KILLED
REQUEUE = signal.SIGUSR1  # Slurm's warning ahead of a time limit or preemption (preemption.py)


def on_main_thread() -> bool:
    """Python installs handlers from the main thread only: elsewhere (a job run in a thread) signals keep theirs."""
    return threading.current_thread() is threading.main_thread()


def install(numbers, handler) -> dict:
    """`handler` for each signal of `numbers`; returns the handlers they had, for restore()."""
    return {number: signal.signal(number, handler) for number in numbers}


def restore(previous: dict) -> None:
    """Put back the handlers install() returned."""
    for number, handler in previous.items():
        signal.signal(number, handler)


def ignore(number: int) -> None:
    """Ignore `number` from here on in this process."""
    signal.signal(number, signal.SIG_IGN)


def exit_as_killed(number: int) -> None:
    """What `number`'s default action would do, from any thread (a handler can be changed from the main one only):
    this process ends at once, with the status a shell gives a process `number` killed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + number)


def name(number: int) -> str:
    """`SIGTERM` for 15: the name a message gives."""
    return signal.Signals(number).name


class StopWatch:
    """SIGTERM and SIGINT handed to `on_signal(number)` on a helper thread: the main thread may sit in C code for
    minutes, where a Python handler would not run.

    Python's C-level handler writes the signal number to a wakeup pipe from whatever thread
    receives it; the helper reads it and calls `on_signal`.
    """

    def __init__(self, on_signal: Callable[[int], None]):
        self.on_signal = on_signal
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.old_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.previous = install(STOPPING, lambda *_: None)
        self.thread = threading.Thread(target=self._wait, name="mpi_train-signal-watch", daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        while True:
            try:
                received = os.read(self.read_fd, 1)
            except OSError:
                return
            if not received or received[0] == 0:  # closed, or the stop byte from release()
                return
            if received[0] in STOPPING:
                self.on_signal(received[0])

    def release(self) -> None:
        """The handlers and wakeup pipe this process had before, and the helper thread stopped."""
        signal.set_wakeup_fd(self.old_fd)
        restore(self.previous)
        os.write(self.write_fd, b"\0")
