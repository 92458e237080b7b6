"""Relaunch a failed job from its last checkpoint: `python -m mpi_train supervise --max-restarts N -- LAUNCH LINE`.

    python -m mpi_train supervise --max-restarts 3 -- mpirun -np 4 --hostfile hostfile \\
        python -m mpi_train --checkpoint-dir ckpt --checkpoint-every 50 --resume auto

The launch line runs in a process group of its own with its output passed through. When it
fails for a reason a restart can fix (a rank died or was signalled, a host or link went away,
a hang hit --timeout: anything that is neither of the two below), it is relaunched with
`--resume auto` after a back-off that doubles each time; --resume auto continues the same
MLflow run. It is not relaunched when:
- the job refused its input (exit status 2: a bad flag, file or checkpoint; restarting runs
  the same line), or
- a rank raised an error of its own (a bug, not a collective that failed because a peer
  went), or the same failure came back at the same checkpoint: a restart would only repeat it.
Then it stops and exits with the job's status, after the job's own message.

Before relaunching an mpirun line that spans hosts, it asks each host to start a process
(through mpirun, as the job will). A host that does not answer is waited for up to
--host-wait seconds (a link that comes back); a host still gone stops the supervision, unless
--min-ranks N allows going on without it: then the line is relaunched on the hosts left, with
as many ranks (at least N) as split the same global batch, and --reshard, which continues the
checkpoint on that number of ranks (the MLflow run logs the change in time/world_size). SIGINT and
SIGTERM are passed on to the launcher and end the supervision; nothing of the job is left
running when it exits.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint import list_checkpoints
from ..config import RESUME_AUTO
from ..errors import UserError, format_error
from . import launchline, mpirun

BAD_INPUT = 2  # UserError's exit status: the job refused its flags, files or checkpoint
# a rank's own error (rankguard.guarded): `mpi_train: rank 1 on h2 failed (ValueError: ...); stopping every rank.`
OWN_ERROR = re.compile(r"^mpi_train: rank \d+ on \S+ failed \((.*)\); stopping every rank\.")
KEPT_LINES = 400  # of the job's output, to find why it failed
HOST_RETRY_S = 5.0  # between two askings of a host that did not answer


@dataclass(frozen=True)
class Attempt:
    """How one launch ended: its exit status, the latest checkpoint's step then, and a rank's own error if any."""

    status: int
    checkpoint_step: int | None
    own_error: str | None
    seconds: float

    def verdict(self, previous: Attempt | None) -> str | None:
        """Why a restart cannot help (None: it may)."""
        if self.status == BAD_INPUT:
            return "the job refused its input (exit status 2); relaunching would refuse it again"
        if self.own_error:
            return f"a rank raised an error of its own ({self.own_error}); relaunching would run the same code again"
        if previous and previous.status == self.status and previous.checkpoint_step == self.checkpoint_step:
            return (f"it failed the same way twice (exit status {self.status}) with no checkpoint in between "
                    f"(latest: step {self.checkpoint_step})")
        return None


def relaunch_line(line: list[str]) -> list[str]:
    """The launch line with `--resume auto` (in place of any other --resume)."""
    out, skip = [], False
    for token in line:
        if skip:
            skip = False
            continue
        if token == "--resume":
            skip = True
            continue
        if token.startswith("--resume="):
            continue
        out.append(token)
    return [*out, "--resume", RESUME_AUTO]


def checkpoint_dir(line: list[str]) -> Path:
    for i, token in enumerate(line):
        if token == "--checkpoint-dir" and i + 1 < len(line):
            return Path(line[i + 1])
        if token.startswith("--checkpoint-dir="):
            return Path(token.split("=", 1)[1])
    raise UserError("the launch line has no --checkpoint-dir, so a relaunch would start from step 0. Add "
                    "--checkpoint-dir DIR --checkpoint-every N to the training flags after the `--`.")


def latest_step(folder: Path) -> int | None:
    found = list_checkpoints(folder)
    return int(found[-1].stem.split("-")[1]) if found else None


class Launch:
    """One run of the launch line: output passed through and its last lines kept; stopped as a whole."""

    def __init__(self, line: list[str], env: dict):
        self.lines: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self.process = mpirun.start(line, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    errors="replace", bufsize=1)
        self.readers = [threading.Thread(target=self._relay, args=(stream, out), daemon=True)
                        for stream, out in ((self.process.stdout, sys.stdout), (self.process.stderr, sys.stderr))]
        for reader in self.readers:
            reader.start()

    def _relay(self, stream, out) -> None:
        for text in stream:
            self.lines.append(text.rstrip("\n"))
            out.write(text)
            out.flush()

    def wait(self) -> int:
        status = self.process.wait()
        for reader in self.readers:
            reader.join(5)
        return status

    def own_error(self) -> str | None:
        for text in self.lines:
            found = OWN_ERROR.match(text)
            if found:
                return found.group(1)
        return None


def hosts_gone(line: list[str], where: launchline.Placement, wait_s: float, stopping: list[int]) -> set[str]:
    """The hosts of `where` that still do not answer after up to `wait_s` (asked again every HOST_RETRY_S)."""
    down = set(where.names) - launchline.answering(line, where.names, dict(os.environ))
    if down:
        say(f"host(s) {', '.join(sorted(down))} do not answer; asking again every {HOST_RETRY_S:g} s for up to "
            f"{wait_s:g} s.")
    deadline = time.monotonic() + wait_s
    while down and not stopping and time.monotonic() < deadline:
        time.sleep(min(HOST_RETRY_S, max(0.0, deadline - time.monotonic())))
        down -= launchline.answering(line, sorted(down), dict(os.environ))
    return down


def supervise(line: list[str], max_restarts: int, backoff_s: float, min_ranks: int | None = None,
              host_wait_s: float = 60.0) -> int:
    folder = checkpoint_dir(line)
    where = launchline.placement(line)  # None: not an mpirun line across hosts, whose hosts are not asked
    if min_ranks is not None and where is None:
        raise UserError("--min-ranks lets a job go on without a host that is gone, and the launch line names no "
                        "hosts to leave out. Use it with an mpirun line with --hostfile or --host over 2 or more "
                        "hosts, or drop --min-ranks.")
    command = relaunch_line(line) if "--resume" not in " ".join(line) else line
    stopping: list[int] = []  # a signal this process received: pass it on, restart no more
    launch: Launch | None = None

    def forward(number, frame) -> None:
        stopping.append(number)
        if launch is not None and launch.process.poll() is None:
            launch.process.send_signal(number)

    previous_handlers = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous: Attempt | None = None
    scratch = Path(tempfile.mkdtemp(prefix="mpi_train-supervise-"))  # the hostfile of the hosts left, if any
    try:
        for attempt in range(1, max_restarts + 2):
            started = time.monotonic()
            with mpirun.own_tmpdir() as tmpdir:
                launch = Launch(command, {**os.environ, **tmpdir})
                try:
                    status = launch.wait()
                finally:
                    mpirun.stop(launch.process)  # whatever of it is left: its ranks too
            ended = Attempt(status, latest_step(folder), launch.own_error(), time.monotonic() - started)
            if status == 0:
                say(f"the job finished (attempt {attempt}, {ended.seconds:.0f} s).")
                return 0
            if stopping:
                say(f"stopped by {signal.Signals(stopping[0]).name}; not relaunching.")
                return 128 + stopping[0]
            reason = ended.verdict(previous)
            latest = f"latest checkpoint: step {ended.checkpoint_step}" if ended.checkpoint_step else "no checkpoint"
            if reason:
                say(f"attempt {attempt} failed (exit status {status}, {latest}) and is not relaunched: {reason}.")
                return status
            if attempt > max_restarts:
                say(f"attempt {attempt} failed (exit status {status}, {latest}); --max-restarts {max_restarts} "
                    f"reached, giving up.")
                return status
            wait_s = backoff_s * 2 ** (attempt - 1)
            say(f"attempt {attempt} failed (exit status {status}, {latest}) after {ended.seconds:.0f} s; relaunching "
                f"with --resume auto in {wait_s:g} s (restart {attempt} of {max_restarts}).")
            command = relaunch_line(line)
            previous = ended
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and not stopping:
                time.sleep(0.1)
            gone = hosts_gone(line, where, host_wait_s, stopping) if where else set()
            if stopping:
                say(f"stopped by {signal.Signals(stopping[0]).name}; not relaunching.")
                return 128 + stopping[0]
            if gone:
                smaller = where.fewer(gone, min_ranks) if min_ranks else None
                if smaller is None:
                    say(f"host(s) {', '.join(sorted(gone))} did not answer for {host_wait_s:g} s; not relaunching: "
                        + (f"the hosts left cannot run {min_ranks} or more ranks that split the global batch of "
                           f"{where.batch_size}. " if min_ranks else "a job on them would fail again. ")
                        + "Relaunch once they are back, or give --min-ranks N to go on without them.")
                    return status
                line = launchline.on_fewer_hosts(line, smaller, scratch)
                say(f"host(s) {', '.join(sorted(gone))} did not answer for {host_wait_s:g} s: going on without them "
                    f"on {', '.join(smaller.names)} with {smaller.ranks} ranks (was {where.ranks}), the global batch "
                    f"of {where.batch_size} resharded (--reshard).")
                where = launchline.placement(line)
                command = relaunch_line(line)
        return 1  # not reached
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)


def say(message: str) -> None:
    print(f"mpi_train supervise: {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mpi_train supervise",
        description="Run a training launch line; when it fails for a reason a restart can fix, relaunch it with "
                    "--resume auto from its last checkpoint (into the same MLflow run).",
        epilog="example: python -m mpi_train supervise --max-restarts 3 -- mpirun -np 4 python -m mpi_train "
               "--checkpoint-dir ckpt --checkpoint-every 50")
    parser.add_argument("--max-restarts", type=int, default=3, help="relaunches at most (default 3)")
    parser.add_argument("--backoff", type=float, default=5.0, metavar="SECONDS",
                        help="wait before the first relaunch, doubled for each next one (default 5)")
    parser.add_argument("--min-ranks", type=int, default=None, metavar="N",
                        help="when a host of an mpirun line is gone for good (no answer for --host-wait), go on "
                             "without it on at least N ranks: the hosts left, as many ranks as split the global "
                             "batch, the data resharded (default: stop and say so)")
    parser.add_argument("--host-wait", type=float, default=60.0, metavar="SECONDS",
                        help="before a relaunch, how long a host of an mpirun line that does not answer is waited "
                             "for (default 60)")
    parser.add_argument("line", nargs=argparse.REMAINDER, help="-- then the launch line")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    line = args.line[1:] if args.line[:1] == ["--"] else args.line
    if not line:
        parser.error("no launch line: put it after `--`, e.g. -- mpirun -np 4 python -m mpi_train --checkpoint-dir "
                     "ckpt --checkpoint-every 50")
    if args.max_restarts < 0 or args.backoff < 0 or args.host_wait < 0:
        parser.error("--max-restarts, --backoff and --host-wait must not be negative")
    if args.min_ranks is not None and args.min_ranks < 1:
        parser.error(f"--min-ranks must be at least 1, got {args.min_ranks}")
    try:
        return supervise(line, args.max_restarts, args.backoff, args.min_ranks, args.host_wait)
    except UserError as error:
        print(format_error(str(error), prog="mpi_train supervise"), file=sys.stderr)
        return BAD_INPUT
    except FileNotFoundError as error:
        print(format_error(f"cannot start the launch line: {error.strerror}: {error.filename}. Check its first word "
                           f"(mpirun, torchrun, srun) is on PATH.", prog="mpi_train supervise"), file=sys.stderr)
        return 127
