"""The rank guard every rank program shares (training, the bench, the cluster check): join the job, parse flags so
that only rank 0 prints, and turn any failure into a clean end of every rank.

    cluster = join_job(argv)
    args = build_parser(quiet=not cluster.info.is_main).parse_args(argv)  # a RankAwareParser
    exit_process(guarded(cluster, lambda: run(cluster, args), timeout_s))
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence

import tomllib

from .cluster import STOP_TOGETHER_S, Cluster, SharedError, note_shared_error
from .config.job_file import read_job_file
from .config.validation import MAX_TIMEOUT_S, MIN_TIMEOUT_S
from .environments import LAUNCHERS
from .errors import ArgumentParser, UserError, format_error, raised_in_collective
from .memory import ran_out, shortfall
from .same_job import check_same_software, software

# what a rank other than 0 waits before it says its own error, so that one every rank meets is said once, by rank 0,
# whose abort (ABORT_SAY_S, then the launcher's kill) ends the others first; a rank that failed alone is 2 s later
RANK_0_FIRST_S = 2.0
# what a backend's error says of a peer whose process ended (its sockets closed), not one that hangs or is slow
PEER_GONE = re.compile(r"closed by peer|reset by peer|broken pipe", re.IGNORECASE)
TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)  # what Gloo and NCCL say of a collective past --timeout
SOURCE_LINE = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")  # Gloo's `[.../pair.cc:561] `
MEETING_TIMEOUT_S = 300.0  # --timeout's default: how long ranks a store brings together (torchrun, srun) wait


class RankAwareParser(ArgumentParser):
    """An ArgumentParser that stays silent on ranks other than 0, so errors and --help print once."""

    def __init__(self, *args, quiet: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.quiet = quiet

    def _print_message(self, message, file=None):  # the single choke point for argparse output
        if not self.quiet:
            super()._print_message(message, file)


def said_by_backend(error: BaseException) -> str:
    """The first sentence of what the backend said, without the C++ source line Gloo puts first: `Connection closed
    by peer [127.0.0.1]:12699`."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    first = SOURCE_LINE.sub("", text.splitlines()[0])
    return first.split(". ", 1)[0].rstrip(".")


def collective_failure(cluster: Cluster, error: BaseException, timeout_s: float | None) -> str:
    info = cluster.info
    first_line = said_by_backend(error)
    cut_off, silent = cluster.liveness.cut_off_s(), cluster.liveness.silent()
    limit = f" (now {timeout_s:g} s)" if timeout_s else ""
    if cut_off:
        cause = (f"Rank 0 (on {cluster.hosts[0]}) has not answered this rank's heartbeat for {cut_off:.0f} s: this "
                 f"host's network link is down, or rank 0 is gone.")
        advice = "Check this host's network link; with --checkpoint-every, --resume continues the job once it is back."
    elif silent:
        cause = ("Unreachable: " + "; ".join(stall.describe() for stall in silent)
                 + ": its network link is down, or the host is gone.")
        if cluster.liveness.alone():  # every other host: the cut may as well be on this side
            cause += f" (Every other host went silent: the link of this host, {info.host}, may be the one down.)"
        advice = "Check that host's network link; with --checkpoint-every, --resume continues the job once it is back."
    elif PEER_GONE.search(str(error)):  # its sockets closed: the process has ended, not hung
        gone = ", ".join(f"rank {rank} on {cluster.hosts[rank]}" for rank in cluster.laggards()) or "another rank"
        cause = (f"{gone[0].upper()}{gone[1:]} ended: its process is gone. A rank that fails says why, above or "
                 f"below; one killed says nothing: by hand, or by the kernel's out-of-memory killer, which mpirun "
                 f"reports as signal 9 (Killed).")
        advice = ("If the kernel killed it for memory (`dmesg | grep -i 'killed process'` on that host), lower "
                  "--batch-size; with --checkpoint-every, --resume continues the job.")
    else:
        behind = ", ".join(f"rank {rank} on {cluster.hosts[rank]}" for rank in cluster.laggards())
        if behind:
            cause = f"Behind the others: {behind}; it failed, is stuck, or is too slow there."
        elif TIMED_OUT.search(str(error)):  # every rank's progress reached this step: one never left it
            cause = ("Every rank had reached this step, so one is stuck inside it (stopped, or hung in its own code or "
                     "a device call), or failed first and says why above or below.")
        else:
            cause = "Another rank most likely failed first; its own message is above or below."
        advice = f"If a rank is only slow (first-time data loading, a busy host), raise --timeout{limit}."
    return (f"rank {info.rank} on {info.host}: a collective operation failed ({first_line}). {cause} "
            f"Stopping every rank. {advice}")


def keep_unsaid(cluster: Cluster, message: str, timeout_s: float | None = None) -> None:
    """An error every rank raises together is printed by rank 0 alone; the others keep what they would say of it, in
    case it was theirs alone after all (exit_process says it if the others do not stop too)."""
    info = cluster.info
    unsaid = None if info.is_main else format_error(f"rank {info.rank} on {info.host}: {message}")
    note_shared_error(SharedError(unsaid, timeout_s or STOP_TOGETHER_S))


def said_once(cluster: Cluster, error: UserError, timeout_s: float | None = None) -> int:
    """An error every rank raises together, printed by rank 0 alone (keep_unsaid); its exit status."""
    if cluster.info.is_main:
        print(format_error(str(error)), file=sys.stderr)
    keep_unsaid(cluster, str(error), timeout_s)
    return error.exit_code


def guarded(cluster: Cluster, body: Callable[[], int | None], timeout_s: float | None = None,
            memory_fix: str = "lower --batch-size, or use a smaller model") -> int:
    """Run `body`; a failure on any rank ends the whole job instead of leaving peers blocked.

    Errors every rank raised together exit normally (rank 0 prints them once); anything
    else prints on the rank that failed and aborts the MPI job, which stops every rank.
    `memory_fix`: what to change when a rank runs out of memory (the program's own flags).
    """
    info = cluster.info
    try:
        return body() or 0
    except UserError as error:
        if error.collective:
            return said_once(cluster, error, timeout_s)
        if not info.is_main:  # the same fault on rank 0 too (a batch too large for every rank): its abort ends this
            time.sleep(RANK_0_FIRST_S)  # rank before it says the same again
        print(format_error(f"rank {info.rank} on {info.host}: {error}"), file=sys.stderr)
        cluster.abort(error.exit_code)
    except KeyboardInterrupt:
        print(f"mpi_train: rank {info.rank} on {info.host} interrupted; stopping every rank.", file=sys.stderr)
        cluster.abort(130)
    except BaseException as error:  # noqa: BLE001 - any other failure on one rank stops every rank (below)
        if raised_in_collective(error):  # a symptom of another rank's failure: say who, not where in torch
            print(format_error(collective_failure(cluster, error, timeout_s)), file=sys.stderr)
        elif ran_out(error):  # a batch or a model too large for the device: where in torch tells nothing
            print(format_error(f"rank {info.rank} on {info.host} ran out of memory: {shortfall(error)}. Stopping "
                               f"every rank: {memory_fix}."), file=sys.stderr)
        else:
            print(f"mpi_train: rank {info.rank} on {info.host} failed ({type(error).__name__}: {error}); stopping "
                  f"every rank.\n{traceback.format_exc()}", file=sys.stderr, end="")
        cluster.abort(1)
    return 1  # not reached: abort ends the process


def local_job_file(path: str | None) -> dict:
    """The keys of this host's copy of the job file (--config), or none where it is missing or unreadable: the
    file's mistakes are said once the flags are read, from rank 0's copy."""
    try:
        return tomllib.loads(read_job_file(path)) if path else {}
    except (UserError, tomllib.TOMLDecodeError):
        return {}


def meeting_options(argv: Sequence[str] | None) -> tuple[str, float]:
    """--launcher and --timeout, which the ranks need before they meet to read the other flags: each from the
    command line, else this host's job file, else its default. A value the flags refuse is said once they are read;
    until then the default stands in (NaN too)."""
    early = argparse.ArgumentParser(add_help=False)
    for flag in ("--launcher", "--timeout", "--config"):
        early.add_argument(flag)
    known, _ = early.parse_known_args(argv)
    in_file = local_job_file(known.config)
    launcher = known.launcher or (in_file.get("launcher") if in_file.get("launcher") in LAUNCHERS else "auto")
    timeout = known.timeout if known.timeout is not None else in_file.get("timeout")
    try:
        timeout_s = MEETING_TIMEOUT_S if timeout is None or isinstance(timeout, bool) else float(timeout)
    except (TypeError, ValueError):
        timeout_s = MEETING_TIMEOUT_S
    if not MIN_TIMEOUT_S <= timeout_s <= MAX_TIMEOUT_S:
        timeout_s = MEETING_TIMEOUT_S
    return launcher, timeout_s


def join_job(argv: Sequence[str] | None) -> Cluster:
    """Discovery through the launcher --launcher names (auto: the one detected), before the other flags are
    parsed (they print on rank 0 only); a clear error and exit status 2 if it fails."""
    launcher, timeout_s = meeting_options(argv)
    try:
        cluster = Cluster.discover(launcher, timeout_s)
    except UserError as error:
        if getattr(error, "rank", 0):  # found alike by every rank of a job that met: rank 0 says it
            time.sleep(RANK_0_FIRST_S)  # before this rank's exit can end rank 0's
        else:
            print(format_error(str(error)), file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    try:
        check_same_software(cluster.allgather(software()), cluster.hosts)
    except UserError as error:  # every rank's verdict, from the same answers: said once
        if cluster.info.is_main:
            print(format_error(str(error)), file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    return cluster
