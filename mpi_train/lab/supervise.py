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
checkpoint on that number of ranks (the MLflow run logs the change in time/world_size). A host
that did not answer at first and has been lost before is left out the same way, though it
answers again: a flapping host would fail the relaunch too, and rejoins by growing instead.

A job on fewer ranks than it may have (--max-ranks, the line's -np by default) grows back: the
hosts it left, those of its hostfile (re-read) and those a --host-discovery-script prints are
asked every few seconds (host_watch.py), and once some have answered for --host-cooldown and
the steps left save more than a relaunch costs (growth.py), the job is asked to stop at its next
step boundary (SIGUSR1, the agreed stop Slurm's requeue uses: every rank checkpoints the same
step) and is relaunched on the larger hostfile with --reshard. A grow is not a restart: it
counts against no --max-restarts.

When a rank says the job is stopping and the launcher is still up LINGER_GRACE_S later (mpirun
waiting on a daemon on a host that is cut off), the launcher is ended, so that a shrink or a
grow never waits on it. SIGINT and SIGTERM are passed on to the launcher and end the
supervision; nothing of the job is left running when it exits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint import list_checkpoints
from ..config import RESUME_AUTO
from ..errors import ArgumentParser, UserError, format_error
from ..preemption import REQUEUE_EXIT
from ..tracking.attempts import RELAUNCH_FILE
from . import launchline, mpirun
from .growth import GrowthCase
from .host_watch import Candidates, HostWatch, check_script
from .supervised_launch import Launch, say

BAD_INPUT = 2  # UserError's exit status: the job refused its flags, files or checkpoint
HOST_RETRY_S = 5.0  # between two askings of a host that did not answer
DEFAULT_RELAUNCH_S = 60.0  # what a relaunch is taken to cost before one is measured
GROW_POLL_S = 2.0  # between two askings of the hosts a job may grow onto (sooner when one ends its cooldown)
# a host the job may grow onto that takes longer to answer does not answer: a probe sent while its link was down must
# not be taken for an answer, nor hold the next asking, once the link is back
GROW_PROBE_TIMEOUT_S = 6.0


@dataclass(frozen=True)
class Attempt:
    """How one launch ended: its exit status, the latest checkpoint's step then, and a rank's own error if any."""

    status: int
    checkpoint_step: int | None
    own_error: str | None
    seconds: float
    spoke: bool = True  # some rank printed a line (Launch.spoke)

    def verdict(self, previous: Attempt | None) -> str | None:
        """Why a restart cannot help (None: it may)."""
        if self.status == BAD_INPUT:
            return "the job refused its input (exit status 2); relaunching would refuse it again"
        if previous is None and not self.spoke:
            return ("the launch line ended before any rank of the job printed a line: the launcher's own message is "
                    "above, and a relaunch would meet it again")
        if self.own_error:
            return f"a rank raised an error of its own ({self.own_error}); relaunching would run the same code again"
        if previous and previous.status == self.status and previous.checkpoint_step == self.checkpoint_step:
            latest = "none yet" if self.checkpoint_step is None else f"step {self.checkpoint_step}"
            return (f"it failed the same way twice (exit status {self.status}) with no checkpoint in between "
                    f"(latest: {latest})")
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


def hosts_gone(line: list[str], where: launchline.Placement, wait_s: float,
               stopping: list[int]) -> tuple[set[str], set[str]]:
    """The hosts of `where` that did not answer when first asked, and those that still do not after up to `wait_s`
    (asked again every HOST_RETRY_S)."""
    missed = set(where.names) - launchline.answering(line, where.names, dict(os.environ))
    if missed:
        say(f"host(s) {', '.join(sorted(missed))} do not answer; asking again every {HOST_RETRY_S:g} s for up to "
            f"{wait_s:g} s.")
    down, deadline = set(missed), time.monotonic() + wait_s
    while down and not stopping and time.monotonic() < deadline:
        time.sleep(min(HOST_RETRY_S, max(0.0, deadline - time.monotonic())))
        down -= launchline.answering(line, sorted(down), dict(os.environ))
    return missed, down


@dataclass(frozen=True)
class SuperviseOptions:
    """The supervisor's flags."""

    max_restarts: int = 3
    backoff_s: float = 5.0
    min_ranks: int | None = None
    host_wait_s: float = 60.0
    max_ranks: int | None = None  # None: the launch line's ranks
    discovery_script: str | None = None
    cooldown_s: float = 10.0
    relaunch_cost_s: float | None = None  # None: measured, DEFAULT_RELAUNCH_S until a relaunch has been


@dataclass(frozen=True)
class Growth:
    """A grow the supervisor asked for: where the job goes, and why (for the run's restart tag)."""

    where: launchline.Placement
    reason: str


class GrowWatch(threading.Thread):
    """While a launch runs on fewer ranks than it may: the candidate hosts asked every GROW_POLL_S and, once some
    are ready and growing pays, the job asked to stop at its next step boundary (the supervisor's `growing`)."""

    def __init__(self, supervisor: Supervisor, launch: Launch):
        super().__init__(daemon=True)
        self.supervisor, self.launch = supervisor, launch
        self.done = threading.Event()
        self.said: set = set()  # the decisions printed, each once

    def run(self) -> None:
        wait_s = GROW_POLL_S
        while not self.done.wait(wait_s) and self.launch.process.poll() is None:
            asked = self.ask()
            cooling = self.supervisor.watch.next_ready_in(asked)
            wait_s = GROW_POLL_S if cooling is None else min(GROW_POLL_S, cooling + 0.05)

    def ask(self) -> set[str]:
        """One round: the candidates asked, their answers noted, the job asked to stop when growing pays; the hosts
        asked."""
        outside = self.outside()
        if outside and not self.done.is_set():
            self.consider(outside)
        return set(outside)

    def outside(self) -> dict[str, int]:
        sup = self.supervisor
        offered = sup.candidates.offered(say, cancel=self.done)
        return {host: slots for host, slots in offered.items() if host not in sup.where.names}

    def consider(self, outside: dict[str, int]) -> None:
        sup = self.supervisor
        answering = launchline.answering(sup.line, sorted(outside), dict(os.environ), cancel=self.done,
                                         timeout_s=GROW_PROBE_TIMEOUT_S)
        if self.done.is_set():
            return
        for host in sup.watch.observe(set(outside), answering):
            say(f"host {host} stopped answering while it cooled down (an asking failed or went unanswered for "
                f"{GROW_PROBE_TIMEOUT_S:g} s); "
                f"it is asked again, and ready once it has answered for {sup.watch.cooldown(host):g} s.")
        ready = sorted(sup.watch.ready(set(outside)))
        grown = sup.where.more(tuple((host, outside[host]) for host in ready), sup.max_ranks) if ready else None
        progress = self.launch.progress.now()
        if grown is None or progress is None or self.done.is_set():
            return
        step, total, step_s = progress
        cost, source = sup.relaunch_cost()
        case = GrowthCase(step=step, total_steps=total, step_s=step_s, ranks=sup.where.ranks,
                          grown_ranks=grown.ranks, relaunch_s=cost, cost_source=source)
        offered_slots = sum(slots for _, slots in grown.hosts)
        split = (f" ({offered_slots} slots offered, {grown.ranks} ranks used: as many as split the global batch of "
                 f"{grown.batch_size})" if grown.ranks < min(offered_slots, sup.max_ranks) else "")
        reason = sup.why_grown(ready)
        if (tuple(ready), case.pays) not in self.said:
            self.said.add((tuple(ready), case.pays))
            say(case.line(reason[0].upper() + reason[1:]) + split)
        if case.pays:
            sup.growing = Growth(grown, reason)
            self.done.set()
            self.launch.ask_to_stop()


class Supervisor:
    """The launches of one supervised job: relaunched after a failure a restart can fix, shrunk when a host is gone
    for good (--min-ranks), grown when hosts return or join (up to --max-ranks)."""

    def __init__(self, line: list[str], options: SuperviseOptions):
        self.options, self.line = options, line
        self.folder = checkpoint_dir(line)
        first = launchline.placement(line, hosts_at_least=1)
        check_growth_flags(options, first)
        # None: a line whose hosts are not asked (it names none, or one that it could neither leave nor grow from)
        growing = bool(options.max_ranks or options.discovery_script)
        self.where = first if first is not None and (len(first.hosts) > 1 or growing) else None
        self.max_ranks = options.max_ranks or (first.ranks if first else 0)
        self.candidates = Candidates(first, launchline.hostfile_of(line), options.discovery_script) if first else None
        self.watch = HostWatch(options.cooldown_s)
        self.used: set[str] = set(first.names) if first else set()  # hosts the job has run on
        self.stopping: list[int] = []  # a signal this process received: pass it on, restart no more
        self.launch: Launch | None = None
        self.growing: Growth | None = None
        self.relaunch_s: float | None = None  # the last relaunch's cost, from its stop (or launch) to its first step
        self.relaunch_began: float | None = None  # when the launch running began to be relaunched (None: the first)
        self.scratch = Path(tempfile.mkdtemp(prefix="mpi_train-supervise-"))  # the hostfiles of later placements

    def forward(self, number, frame) -> None:
        self.stopping.append(number)
        if self.launch is not None:
            self.launch.pass_on(number)

    def why_grown(self, hosts: list[str]) -> str:
        back, new = [h for h in hosts if h in self.used], [h for h in hosts if h not in self.used]
        return "; ".join(([f"host(s) {', '.join(back)} returned"] if back else [])
                         + ([f"new host(s) {', '.join(new)} joined"] if new else []))

    def relaunch_cost(self) -> tuple[float, str]:
        """What a relaunch costs, and whence: --relaunch-cost when given, else the last relaunch's (the running
        launch's, once it has stepped), else DEFAULT_RELAUNCH_S."""
        if self.options.relaunch_cost_s is not None:
            return self.options.relaunch_cost_s, "stated: --relaunch-cost"
        first_step = self.launch.progress.first_at() if self.launch is not None else None
        if self.relaunch_began is not None and first_step is not None:
            return first_step - self.relaunch_began, "measured"
        if self.relaunch_s is not None:
            return self.relaunch_s, "measured"
        return DEFAULT_RELAUNCH_S, "assumed"

    def launch_once(self, command: list[str], relaunch_began: float | None) -> Attempt:
        """One launch to its end (its ranks stopped whatever happened), watched for a grow when it may have one."""
        self.growing, self.relaunch_began = None, relaunch_began
        with mpirun.own_tmpdir() as tmpdir:
            self.launch = launch = Launch(command, {**os.environ, **tmpdir})
            watcher = None
            if self.candidates is not None and self.where is not None and self.where.ranks < self.max_ranks:
                watcher = GrowWatch(self, launch)
                watcher.start()
            try:
                status = launch.wait()
            finally:
                if watcher is not None:
                    watcher.done.set()
                    watcher.join()
                mpirun.stop(launch.process)  # whatever of it is left: its ranks too
        first_step = launch.progress.first_at()
        if relaunch_began is not None and first_step is not None:
            self.relaunch_s = first_step - relaunch_began
        return Attempt(status, latest_step(self.folder), launch.own_error(), time.monotonic() - launch.launched_at,
                       launch.spoke())

    def run(self) -> int:
        options = self.options
        command = relaunch_line(self.line) if "--resume" not in " ".join(self.line) else self.line
        previous: Attempt | None = None
        attempt, restarts, relaunch_began = 0, 0, None
        while True:
            attempt += 1
            ended = self.launch_once(command, relaunch_began)
            status = ended.status
            if status == 0:
                say(f"the job finished (attempt {attempt}, {ended.seconds:.0f} s).")
                return 0
            if self.stopping:
                say(f"stopped by {signal.Signals(self.stopping[0]).name}; not relaunching.")
                return 128 + self.stopping[0]
            if status == REQUEUE_EXIT and self.growing is not None:
                relaunch_began = self.launch.stop_asked_at
                command = self.grow(self.growing, ended)
                continue
            reason = ended.verdict(previous)
            latest = f"latest checkpoint: step {ended.checkpoint_step}" if ended.checkpoint_step else "no checkpoint"
            if reason:
                say(f"attempt {attempt} failed (exit status {status}, {latest}) and is not relaunched: {reason}.")
                return status
            if restarts >= options.max_restarts:
                say(f"attempt {attempt} failed (exit status {status}, {latest}); --max-restarts "
                    f"{options.max_restarts} reached, giving up.")
                return status
            restarts += 1
            wait_s = options.backoff_s * 2 ** (restarts - 1)
            say(f"attempt {attempt} failed (exit status {status}, {latest}) after {ended.seconds:.0f} s; relaunching "
                f"with --resume auto in {wait_s:g} s (restart {restarts} of {options.max_restarts}).")
            previous = ended
            command = self.after_failure(wait_s, status)
            if not isinstance(command, list):
                return command
            relaunch_began = time.monotonic()

    def after_failure(self, wait_s: float, status: int) -> list[str] | int:
        """The back-off, then the hosts asked: the command to relaunch, on the hosts left if some are gone for good
        and --min-ranks allows it; or the exit status when the supervision ends here."""
        options = self.options
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(0.1)
        where = self.where
        missed, gone = hosts_gone(self.line, where, options.host_wait_s, self.stopping) if where else (set(), set())
        if self.stopping:
            say(f"stopped by {signal.Signals(self.stopping[0]).name}; not relaunching.")
            return 128 + self.stopping[0]
        self.watch.lost(missed)
        # a host lost more than once would likely fail the relaunch too: when the job can go on without it, it
        # rejoins by growing, once it has answered for its (doubled) cooldown
        flapping = self.watch.flapping(missed - gone) if options.min_ranks else set()
        if flapping and where.fewer(gone | flapping, options.min_ranks) is None:
            flapping = set()
        if gone | flapping:
            smaller = where.fewer(gone | flapping, options.min_ranks) if options.min_ranks else None
            if smaller is None:
                say(f"host(s) {', '.join(sorted(gone))} did not answer for {options.host_wait_s:g} s; not relaunching: "
                    + (f"the hosts left cannot run {options.min_ranks} or more ranks that split the global batch of "
                       f"{where.batch_size}. " if options.min_ranks else "a job on them would fail again. ")
                    + "Relaunch once they are back, or give --min-ranks N to go on without them.")
                return status
            why = [f"host(s) {', '.join(sorted(gone))} did not answer for {options.host_wait_s:g} s"] if gone else []
            if flapping:
                why.append(f"host(s) {', '.join(sorted(flapping))} answered again but have been lost "
                           f"{max(self.watch.records[h].losses for h in flapping)} times (asked again until they have "
                           f"answered for {max(self.watch.cooldown(h) for h in flapping):g} s)")
            self.line = launchline.on_hosts(self.line, smaller, self.scratch)
            say(f"{'; '.join(why)}: going on without them on {', '.join(smaller.names)} with {smaller.ranks} ranks "
                f"(was {where.ranks}), the global batch of {where.batch_size} resharded (--reshard).")
            self.where = smaller
        return relaunch_line(self.line)

    def grow(self, growth: Growth, ended: Attempt) -> list[str]:
        """The job stopped at a checkpoint for the grow: the command on the larger placement, and the reason left
        beside the checkpoints for the run's restart tag."""
        say(f"the job stopped at step {ended.checkpoint_step} to grow: relaunching on "
            f"{', '.join(growth.where.names)} with {growth.where.ranks} ranks (was {self.where.ranks}), the global "
            f"batch of {growth.where.batch_size} resharded (--reshard).")
        (self.folder / RELAUNCH_FILE).write_text(json.dumps({"reason": growth.reason, "grow": True}))
        self.line = launchline.on_hosts(self.line, growth.where, self.scratch)
        self.where = growth.where
        self.used |= set(growth.where.names)
        return relaunch_line(self.line)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def check_growth_flags(options: SuperviseOptions, first: launchline.Placement | None) -> None:
    """Refuse flags that cannot work with this launch line, before anything starts."""
    if options.min_ranks is not None and (first is None or len(first.hosts) < 2):
        raise UserError("--min-ranks lets a job go on without a host that is gone, and the launch line names no "
                        "hosts to leave out. Use it with an mpirun line with --hostfile or --host over 2 or more "
                        "hosts, or drop --min-ranks.")
    if options.min_ranks is not None and options.min_ranks > first.ranks:
        raise UserError(f"--min-ranks {options.min_ranks} is the fewest ranks the job may go on with after a host is "
                        f"gone, and the launch line starts {first.ranks}: it could never go on without one. Give "
                        f"--min-ranks at most {first.ranks}, or drop it.")
    if (options.max_ranks or options.discovery_script) and first is None:
        raise UserError("--max-ranks and --host-discovery-script grow a job onto more hosts, and the launch line "
                        "names none to grow from. Use them with an mpirun line with --hostfile or --host.")
    if options.discovery_script:
        check_script(options.discovery_script)


def supervise(line: list[str], options: SuperviseOptions) -> int:
    supervisor = Supervisor(line, options)
    previous_handlers = {sig: signal.signal(sig, supervisor.forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return supervisor.run()
    finally:
        supervisor.close()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m mpi_train supervise",
        description="Run a training launch line; when it fails for a reason a restart can fix, relaunch it with "
                    "--resume auto from its last checkpoint (into the same MLflow run), on the hosts left if one is "
                    "gone (--min-ranks), and grow it back when hosts return or join (--max-ranks).",
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
    parser.add_argument("--max-ranks", type=int, default=None, metavar="M",
                        help="grow the job back up to M ranks when hosts it left return, or hosts of its hostfile or "
                             "the discovery script's answer for --host-cooldown, and the steps left save more than a "
                             "relaunch costs (default: the launch line's -np)")
    parser.add_argument("--host-discovery-script", default=None, metavar="SCRIPT",
                        help="an executable that prints `host:slots` lines, the hosts the job may grow onto (run "
                             f"every {GROW_POLL_S:g} s while the job runs on fewer ranks than --max-ranks)")
    parser.add_argument("--host-cooldown", type=float, default=10.0, metavar="SECONDS",
                        help="how long a host must answer steadily before the job grows onto it, doubled each time "
                             "it is lost again, up to 16 times (default 10)")
    parser.add_argument("--relaunch-cost", type=float, default=None, metavar="SECONDS",
                        help="what a relaunch costs, against the time the steps left would save by growing (default: "
                             f"the job's last relaunch, from its stop to its first step; {DEFAULT_RELAUNCH_S:g} s "
                             "before one)")
    parser.add_argument("line", nargs=argparse.REMAINDER, help="-- then the launch line")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    line = args.line[1:] if args.line[:1] == ["--"] else args.line
    if not line:
        parser.error("no launch line: put it after `--`, e.g. -- mpirun -np 4 python -m mpi_train --checkpoint-dir "
                     "ckpt --checkpoint-every 50")
    seconds = {"--backoff": args.backoff, "--host-wait": args.host_wait, "--host-cooldown": args.host_cooldown,
               "--relaunch-cost": args.relaunch_cost or 0.0}
    wrong = [f"{flag} {value:g}" for flag, value in {"--max-restarts": args.max_restarts, **seconds}.items()
             if not 0 <= value < math.inf]  # NaN is not
    if wrong:
        parser.error(f"--max-restarts, --backoff, --host-wait, --host-cooldown and --relaunch-cost take finite numbers "
                     f"of 0 or more, got {', '.join(wrong)}")
    if args.min_ranks is not None and args.min_ranks < 1:
        parser.error(f"--min-ranks must be at least 1, got {args.min_ranks}")
    if args.max_ranks is not None and args.max_ranks < max(1, args.min_ranks or 1):
        parser.error(f"--max-ranks {args.max_ranks} is below --min-ranks {args.min_ranks}: the job could never "
                     f"grow to what it may shrink to. Give --max-ranks at least --min-ranks."
                     if args.min_ranks else f"--max-ranks must be at least 1, got {args.max_ranks}")
    options = SuperviseOptions(max_restarts=args.max_restarts, backoff_s=args.backoff, min_ranks=args.min_ranks,
                               host_wait_s=args.host_wait, max_ranks=args.max_ranks,
                               discovery_script=args.host_discovery_script, cooldown_s=args.host_cooldown,
                               relaunch_cost_s=args.relaunch_cost)
    try:
        return supervise(line, options)
    except UserError as error:
        print(format_error(str(error), prog="mpi_train supervise"), file=sys.stderr)
        return BAD_INPUT
    except FileNotFoundError as error:
        print(format_error(f"cannot start the launch line: {error.strerror}: {error.filename}. Check its first word "
                           f"(mpirun, torchrun, srun) is on PATH.", prog="mpi_train supervise"), file=sys.stderr)
        return 127
