"""One launch of a supervised job: its output passed through, the lines that say why it failed and the steps it
printed kept, stopped as a whole; and ended when it lingers after the job has (mpirun waiting on a daemon on a host
it cannot reach, which TCP's retransmissions can hold for many minutes)."""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import threading
import time

from . import mpirun
from .growth import Progress

# a rank's own error (rankguard.guarded): `mpi_train: rank 1 on h2 failed (ValueError: ...); stopping every rank.`
OWN_ERROR = re.compile(r"^mpi_train: rank \d+ on \S+ failed \((.*)\); stopping every rank\.")
JOB_ENDING = re.compile(r"[Ss]topping every rank")  # a rank's last word on a failed job (rankguard)
KEPT_LINES = 400  # of the job's output, to find why it failed
RANK_SPOKE = re.compile(r"^(mpi_train\b|epoch \d)")  # a line only a rank of the job prints
LINGER_GRACE_S = 5.0  # after a rank said the job is stopping, before a launcher still up is ended


def say(message: str) -> None:
    print(f"mpi_train supervise: {message}", file=sys.stderr, flush=True)


class Launch:
    """One run of the launch line: output passed through, its last lines and printed steps kept; stopped as a whole,
    and ended if it lingers after the job has."""

    def __init__(self, line: list[str], env: dict):
        self.lines: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self.progress = Progress()
        self.launched_at = time.monotonic()
        self.ending_at: float | None = None  # when a rank said the job is stopping
        self.stop_asked_at: float | None = None  # when the supervisor asked the job to stop for a grow
        self.signalled_at: float | None = None  # when SIGINT or SIGTERM was passed on to the launcher
        self.process = mpirun.start(line, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    errors="replace", bufsize=1)
        self.readers = [threading.Thread(target=self._relay, args=(stream, out), daemon=True)
                        for stream, out in ((self.process.stdout, sys.stdout), (self.process.stderr, sys.stderr))]
        for reader in self.readers:
            reader.start()

    def _relay(self, stream, out) -> None:
        for text in stream:
            self.lines.append(text.rstrip("\n"))
            self.progress.read(text)
            if self.ending_at is None and JOB_ENDING.search(text):
                self.ending_at = time.monotonic()
            out.write(text)
            out.flush()

    def wait(self) -> int:
        """The launcher's exit status; a launcher still up LINGER_GRACE_S after a rank said the job is stopping is
        ended (its ranks are gone or going: what holds it is a daemon on a host it cannot reach)."""
        while True:
            try:
                status = self.process.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if self.ending_at is not None and now - self.ending_at > LINGER_GRACE_S:
                    say(f"a rank said the job is stopping {LINGER_GRACE_S:g} s ago and its launcher is still up "
                        f"(waiting on a host it cannot reach): ending it.")
                    mpirun.stop(self.process, grace_s=2.0)
                elif self.signalled_at is not None and now - self.signalled_at > LINGER_GRACE_S:
                    mpirun.stop(self.process, grace_s=2.0)  # it did not pass the signal on and end
        for reader in self.readers:
            reader.join(5)
        return status

    def pass_on(self, number: int) -> None:
        """SIGINT or SIGTERM to the launcher; a launcher that has not ended LINGER_GRACE_S later is ended."""
        self.signalled_at = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(number)

    def ask_to_stop(self) -> None:
        """SIGUSR1 to the launcher, which passes it to every rank: the job checkpoints at its next step boundary and
        exits with REQUEUE_EXIT."""
        self.stop_asked_at = time.monotonic()
        self.process.send_signal(signal.SIGUSR1)

    def spoke(self) -> bool:
        """Some rank of the job printed a line: the launcher started it (a launcher that refused its line, as Open
        MPI refuses root without --allow-run-as-root, prints only its own)."""
        return self.progress.first_at() is not None or any(RANK_SPOKE.match(text) for text in self.lines)

    def own_error(self) -> str | None:
        for text in self.lines:
            found = OWN_ERROR.match(text)
            if found:
                return found.group(1)
        return None
