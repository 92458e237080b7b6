"""`python -m mpi_train soak --restart`: supervised jobs on test hosts, one random fault each, and how they carried on.

Each trial runs one job under `python -m mpi_train supervise --max-restarts 2 --min-ranks N`
(N: the ranks left without one host; it may grow back to the full size, with a host cooldown
and a stated relaunch cost small enough for a grow to pay in a short job) with a checkpoint
every --checkpoint-every steps and `--resume auto`, no dropout (its masks are drawn per rank)
and rank 0 a little slower a step (STRAGGLER), and at a random step does one of:

  kill    SIGKILL to a random rank
  stop    SIGSTOP to a random rank (a hang: the others give up after --timeout)
  link    a random host's link down for LINK_DOWN_S seconds, then up again (within --host-wait)
  term    SIGTERM to a random rank
  return  a random host's link down until the supervisor goes on without it, then up again
          RETURN_AFTER_S later: the supervisor grows the job back
  flap    as return, then the link up and down FLAP_S each, FLAP_TIMES times: at most
          MAX_FLAP_GROWS grows

Before the trials, the same job runs once without a fault: its final weights, final loss,
wall time and step time are the reference. A trial is `ok` when the supervised job exits 0
having trained its last step; its final weights equal the reference's bit for bit (a job that
ran on another number of ranks: its final loss to LOSS_RTOL, since a sum over other ranks
rounds otherwise); its MLflow parent run is the only one of its name, FINISHED, with each
step's loss exactly once; the time it lost (its wall time less the reference's) is at most its
restart time (from the fault to the relaunched job's first step, and from the last step before
each later launch to that launch's first step) plus one checkpoint interval (of the
reference's steps) per failure plus what its steps on fewer ranks took beyond the reference's
plus SLACK_S; a flap trial grew at most MAX_FLAP_GROWS times; and nothing of it is left
running. A return trial also says whether it ended on the full size.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import TrainConfig
from ..errors import UserError
from ..failpoints import SLOW_ENV
from ..tracking import names
from ..tracking.store import mlflow_client
from . import mpirun
from .growth import STEP_LINE
from .network import NetworkSetting
from .soakparts import Server, end_leftovers, hosts_and_server, processes_of, rank_pid
from .testhosts import TestHosts

FAULTS = ("kill", "stop", "link", "term", "return", "flap")
LINK_FAULTS = ("link", "return", "flap")
GROW_FAULTS = ("return", "flap")
LINK_DOWN_S = 20.0
RETURN_AFTER_S = 3.0  # a returning host's link comes back this long after the supervisor went on without it
FLAP_S, FLAP_TIMES = 5.0, 10  # a flapping host: up FLAP_S, down FLAP_S, FLAP_TIMES times, then up for good
MAX_FLAP_GROWS = 2  # more grows for one flapping host is thrashing
MAX_RESTARTS, BACKOFF_S = 2, 2.0
HOST_WAIT_S = 60.0  # a host's link that comes back within this is waited for (the link fault)
GROW_HOST_WAIT_S = 5.0  # return and flap: soon left out, so that the job has steps left to grow back in
HOST_COOLDOWN_S, RELAUNCH_COST_S = 2.0, 1.0  # small: a 20-step job grows back when a host returns
LOSS_RTOL = 1e-3  # a resharded job's final loss against the reference's: float rounding only
# rank 0 a step slower, as on real hosts' compute: test hosts share this machine's cores, so a job shrunk onto one of
# them would step faster than the full one and end before a returning host is ready
STRAGGLER = "0:0.3"
SLACK_S = 2.0  # of the time-lost bound: the jitter of a relaunch's start-up
EXPERIMENT = "soak-restart"
STEP_TIME = re.compile(r"step\s+\d+/\d+\b.*?\sstep (\d+(?:\.\d+)?)s\b")
START_LINE = re.compile(r"mpi_train: (\d+) rank\(s\) on \d+ host\(s\)")  # rank 0's first line, once per launch
GROWING = re.compile(r"ready: .*:\s+growing\.")  # the supervisor's decision to grow ("not growing." is not)
RELAUNCHED = "relaunching with --resume auto"  # the supervisor's word that a failed attempt is started again
SHRUNK = "going on without them"  # the supervisor's word that it relaunches without a host that is gone


@dataclass
class RestartTrial:
    """One supervised job and its fault, and how it carried on."""

    number: int
    fault: str
    target: str  # "rank 3", "host soak2"
    step: int
    exit: int | None = None
    attempts: int = 0
    last_step: int = 0
    weights_equal: bool = False
    loss_rel: float | None = None  # the final loss's relative difference to the reference's
    sizes: str = ""  # the ranks of each launch that trained: "4>2>4"
    grows: int = 0
    parent_runs: int = 0
    run_status: str = "?"
    loss_steps: str = "?"  # "ok" when each step's loss is there exactly once, else what is wrong
    wall_s: float = 0.0
    lost_s: float = 0.0
    restart_s: float | None = None  # fault to the relaunched job's first step and each later launch's, less a step
    interval_s: float = 0.0  # one checkpoint interval of the reference's steps
    failures: int = 0  # failed attempts relaunched: each redoes up to one checkpoint interval
    slower_s: float = 0.0  # what the steps on another number of ranks took beyond the reference's
    left: int = 0
    note: str = ""

    @property
    def resized(self) -> bool:
        return len(set(self.sizes.split(">"))) > 1

    @property
    def ended_full(self) -> bool:
        launches = self.sizes.split(">")
        return bool(self.sizes) and launches[-1] == launches[0]

    @property
    def bound_s(self) -> float | None:
        if self.restart_s is None:
            return None
        return self.restart_s + max(1, self.failures) * self.interval_s + self.slower_s + SLACK_S

    def verdict(self, total_steps: int) -> str:
        problems = []
        if self.exit != 0:
            problems.append("NOT FINISHED" if self.exit is not None else "HANG")
        if self.last_step != total_steps:
            problems.append(f"LAST STEP {self.last_step}")
        if self.resized and (self.loss_rel is None or self.loss_rel > LOSS_RTOL):
            problems.append("LOSS DIFFERS")
        if not self.resized and not self.weights_equal:
            problems.append("WEIGHTS DIFFER")
        if self.parent_runs != 1 or self.run_status != "FINISHED":
            problems.append(f"RUNS {self.parent_runs} {self.run_status}")
        if self.loss_steps != "ok":
            problems.append(f"LOSSES {self.loss_steps}")
        if self.bound_s is None or self.lost_s > self.bound_s:
            problems.append("SLOW")
        if self.fault == "flap" and self.grows > MAX_FLAP_GROWS:
            problems.append(f"THRASHED ({self.grows} grows)")
        if self.left:
            problems.append("LEFT BEHIND")
        return ", ".join(problems) or "ok"


@dataclass(frozen=True)
class Reference:
    """The job without a fault."""

    weights_sha256: str
    final_loss: float
    wall_s: float
    step_s: float


def job_line(args, hostfile: Path, folder: Path, uri: str, run_name: str) -> list[str]:
    world = args.hosts * args.ranks_per_host
    return ["mpirun", "-np", str(world), "--hostfile", str(hostfile), sys.executable, "-m", "mpi_train",
            "--dataset", "synthetic", "--synthetic-size", str(64 * args.steps), "--batch-size", "64",  # one epoch
            "--log-every", "1", "--max-steps", str(args.steps), "--timeout", str(args.timeout),
            "--sync", TrainConfig.sync, "--dropout", "0",  # dropout masks are drawn per rank: not so after a reshard
            "--checkpoint-dir", str(folder / "checkpoints"), "--checkpoint-every", str(args.checkpoint_every),
            "--tracking-uri", uri, "--experiment", EXPERIMENT, "--run-name", run_name,
            "--summary-json", str(folder / "summary.json")]


def supervisor_line(args, fault: str | None) -> list[str]:
    """The supervisor's flags: going on without one host, and growing back to the full size."""
    host_wait = GROW_HOST_WAIT_S if fault in GROW_FAULTS else HOST_WAIT_S
    return [sys.executable, "-m", "mpi_train", "supervise", "--max-restarts", str(MAX_RESTARTS), "--backoff",
            f"{BACKOFF_S:g}", "--host-wait", f"{host_wait:g}", "--min-ranks",
            str((args.hosts - 1) * args.ranks_per_host), "--host-cooldown", f"{HOST_COOLDOWN_S:g}",
            "--relaunch-cost", f"{RELAUNCH_COST_S:g}"]


class Supervised:
    """The supervisor around a job line, its output lines kept with the time each arrived."""

    def __init__(self, supervisor: list[str], line: list[str], env: dict, folder: Path):
        self.lines: list[tuple[float, str]] = []
        self.started = time.monotonic()
        self.process = mpirun.start([*supervisor, "--", *line], env, cwd=folder, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for text in self.process.stdout:
            self.lines.append((time.monotonic(), text))

    def steps(self) -> list[int]:
        return [int(found.group(1)) for _, text in list(self.lines) for found in [STEP_LINE.search(text)] if found]

    def output(self) -> str:
        return "".join(text for _, text in self.lines)


def launches(lines: list[tuple[float, str]]) -> list[tuple[int, list[tuple[float, float | None]]]]:
    """Each launch that printed its first line: its ranks, and its steps as (when printed, step time)."""
    found: list[tuple[int, list[tuple[float, float | None]]]] = []
    for at, text in lines:
        start = START_LINE.search(text)
        if start:
            found.append((int(start.group(1)), []))
        elif found and STEP_LINE.search(text):
            took = STEP_TIME.search(text)
            found[-1][1].append((at, float(took.group(1)) if took else None))
    return found


def restart_time(lines: list[tuple[float, str]], fault_at: float, step_s: float) -> float | None:
    """Seconds spent relaunching: from the fault to the first step of the first relaunch that trained, and from the
    last step printed before each later one to its first step; each less one step (that step's own time). None
    when no relaunch trained."""
    total, before, relaunched = 0.0, fault_at, False
    for _, steps in launches(lines)[1:]:
        if not steps:  # a launch that failed before its first step: its time belongs to the next one's
            continue
        total += steps[0][0] - before - step_s
        before, relaunched = steps[-1][0], True
    return total if relaunched else None


def slower_steps_s(lines: list[tuple[float, str]], step_s: float) -> float:
    """What the relaunched jobs' steps took beyond the reference's step time, each launch's first step left out (it
    is in the restart time); never below 0."""
    extra = sum(took - step_s for _, steps in launches(lines)[1:] for _, took in steps[1:] if took is not None)
    return max(0.0, extra)


def link_schedule(fault: str) -> list[tuple[float, str]]:
    """What a cut link does, as (seconds to wait, then its state): `link` from the cut; `return` and `flap` from
    when the supervisor went on without the host."""
    if fault == "link":
        return [(LINK_DOWN_S, "up")]
    flaps = [(FLAP_S, "down"), (FLAP_S, "up")] * (FLAP_TIMES if fault == "flap" else 0)
    return [(RETURN_AFTER_S, "up"), *flaps]


class LinkFault(threading.Thread):
    """A host's link, cut at the fault, brought back on its fault's schedule; `cancel` stops it where it is (the
    trial's end brings the link up)."""

    def __init__(self, fault: str, host: str, hosts: TestHosts, shrunk: Callable[[], bool]):
        super().__init__(daemon=True)
        self.fault, self.host, self.hosts, self.shrunk = fault, host, hosts, shrunk
        self.stopped = threading.Event()

    def run(self) -> None:
        while self.fault in GROW_FAULTS and not self.shrunk():
            if self.stopped.wait(0.2):
                return
        for wait_s, state in link_schedule(self.fault):
            if self.stopped.wait(wait_s):
                return
            self.hosts.link(self.host, state)

    def cancel(self) -> None:
        self.stopped.set()
        self.join(15)


def launch_env(setting: NetworkSetting) -> dict:
    return {**os.environ, **mpirun.OPEN_MPI_ENV, "PYTHONUNBUFFERED": "1", **TestHosts.launch_env(setting),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]), SLOW_ENV: STRAGGLER}


def run_reference(args, hosts: TestHosts, setting: NetworkSetting, server: Server, folder: Path) -> Reference:
    """The same supervised job without a fault, so that the time a trial lost is the fault's alone."""
    folder.mkdir(parents=True, exist_ok=True)
    line = job_line(args, hosts.hostfile(args.hosts, args.ranks_per_host), folder, server.uri, "reference")
    with mpirun.own_tmpdir() as tmpdir:
        job = Supervised(supervisor_line(args, None), line, {**launch_env(setting), **tmpdir}, folder)
        try:
            code = job.process.wait(600)
        finally:
            mpirun.stop(job.process)
        wall = time.monotonic() - job.started
        job.reader.join(10)
    (folder / "output.txt").write_text(job.output())
    if code != 0:
        raise RuntimeError(f"the reference job failed (exit status {code}); see {folder / 'output.txt'}")
    summary = json.loads((folder / "summary.json").read_text())
    return Reference(summary["weights_sha256"], summary["final_loss"], wall,
                     summary["mean_times_after_warmup"]["step_time_s"])


def run_trial(trial: RestartTrial, args, hosts: TestHosts, setting: NetworkSetting, server: Server, folder: Path,
              reference: Reference) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    marker = str(folder)
    run_name = f"trial-{trial.number:02d}"
    line = job_line(args, hosts.hostfile(args.hosts, args.ranks_per_host), folder, server.uri, run_name)
    trial.interval_s = args.checkpoint_every * reference.step_s
    with ExitStack() as stack:
        env = {**launch_env(setting), **stack.enter_context(mpirun.own_tmpdir())}
        if trial.fault in LINK_FAULTS:
            stack.callback(hosts.link, trial.target.split()[-1], "up")
        job = Supervised(supervisor_line(args, trial.fault), line, env, folder)
        stack.callback(end_leftovers, marker, job.process.pid)  # on every way out, Ctrl-C included, after the stop
        stack.callback(mpirun.stop, job.process)
        deadline = time.monotonic() + 180
        while trial.step not in job.steps() and job.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        fault_at = time.monotonic()
        link_fault = None
        if trial.step not in job.steps():
            trial.note = f"the job never reached step {trial.step}"
        else:
            link_fault = inject(trial, marker, hosts, lambda: SHRUNK in job.output())
            if link_fault:
                stack.callback(link_fault.cancel)
        try:
            trial.exit = job.process.wait(600)
        except subprocess.TimeoutExpired:
            trial.note = "still running 600 s after the fault; stopped"
        trial.wall_s = time.monotonic() - job.started
        mpirun.stop(job.process)
        job.reader.join(10)
        if link_fault:  # the link up again, so that what ran behind it can see the job's end
            link_fault.cancel()
            hosts.link(link_fault.host, "up")
        time.sleep(2)  # what the launch's end leaves to exit on its own
        trial.left = len(processes_of(marker))
    (folder / "output.txt").write_text(job.output())
    judge(trial, job, fault_at, reference)
    summary = folder / "summary.json"
    ending = json.loads(summary.read_text()) if summary.exists() else {}
    trial.weights_equal = ending.get("weights_sha256") == reference.weights_sha256
    if ending.get("final_loss") is not None:
        trial.loss_rel = abs(ending["final_loss"] - reference.final_loss) / abs(reference.final_loss)
    trial.parent_runs, trial.run_status, trial.loss_steps = tracked(server.uri, run_name, args.steps)


def judge(trial: RestartTrial, job: Supervised, fault_at: float, reference: Reference) -> None:
    """What the job's output says: its launches and their sizes, its grows, its steps, the time it lost."""
    lines, output = list(job.lines), job.output()
    trial.sizes = ">".join(str(ranks) for ranks, _ in launches(lines))
    trial.grows = sum(1 for _, text in lines if GROWING.search(text))
    trial.failures = output.count(RELAUNCHED)
    trial.attempts = trial.failures + trial.grows + 1
    trial.restart_s = restart_time(lines, fault_at, reference.step_s)
    trial.slower_s = slower_steps_s(lines, reference.step_s) if trial.resized else 0.0
    trial.lost_s = trial.wall_s - reference.wall_s
    steps = job.steps()
    trial.last_step = max(steps) if steps else 0


def inject(trial: RestartTrial, marker: str, hosts: TestHosts, shrunk: Callable[[], bool]) -> LinkFault | None:
    """The fault; for a link, the thread that brings it back up."""
    if trial.fault in LINK_FAULTS:
        host = trial.target.split()[-1]
        hosts.link(host, "down")
        back = LinkFault(trial.fault, host, hosts, shrunk)
        back.start()
        return back
    pid = rank_pid(marker, int(trial.target.split()[-1]))
    if pid is None:
        trial.note = f"{trial.target} was not found"
        return None
    os.kill(pid, {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}[trial.fault])
    return None


def tracked(uri: str, run_name: str, total_steps: int) -> tuple[int, str, str]:
    """How many parent runs the job has, the status of the first, and whether each step's loss is there once."""
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    where = f"tags.`mpi_train.role` = 'job' and attributes.run_name = '{run_name}'"
    runs = client.search_runs([experiment.experiment_id], where) if experiment else []
    if not runs:
        return 0, "none", "no run"
    steps = sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, names.LOSS))
    expected = list(range(1, total_steps + 1))
    if steps == expected:
        verdict = "ok"
    else:
        doubled = sorted({s for s in steps if steps.count(s) > 1})
        missing = sorted(set(expected) - set(steps))
        verdict = ", ".join(filter(None, (f"doubled {doubled}" if doubled else "",
                                          f"missing {missing}" if missing else ""))) or "unexpected steps"
    return len(runs), runs[0].info.status, verdict


def draw(number: int, rng: random.Random, faults: list[str], args) -> RestartTrial:
    fault = rng.choice(faults)
    world = args.hosts * args.ranks_per_host
    target = f"host {args.prefix}{rng.randrange(1, args.hosts + 1)}" if fault in LINK_FAULTS else \
        f"rank {rng.randrange(world)}"
    # a host that returns needs steps left after its job shrank: cut in the job's first half
    last = max(2, args.steps // 2) if fault in GROW_FAULTS else args.steps - 3
    return RestartTrial(number=number, fault=fault, target=target, step=rng.randint(2, last))


COLUMNS = ("trial", "fault", "target", "step", "exit", "tries", "ranks", "grows", "last", "weights", "run", "losses",
           "lost_s", "restart_s", "bound_s", "left", "verdict")


def weights_cell(trial: RestartTrial) -> str:
    """Bit for bit when the job kept its size; else the final loss's relative difference."""
    if not trial.resized:
        return "equal" if trial.weights_equal else "DIFFER"
    return "loss ?" if trial.loss_rel is None else f"loss {trial.loss_rel:.0e}"


def format_table(trials: list[RestartTrial], total_steps: int) -> str:
    rows = [(str(t.number), t.fault, t.target, str(t.step), "-" if t.exit is None else str(t.exit), str(t.attempts),
             t.sizes or "-", str(t.grows), str(t.last_step), weights_cell(t), f"{t.parent_runs} {t.run_status}",
             t.loss_steps, f"{t.lost_s:.1f}", "-" if t.restart_s is None else f"{t.restart_s:.1f}",
             "-" if t.bound_s is None else f"{t.bound_s:.1f}", str(t.left),
             t.verdict(total_steps) + (f" ({t.note})" if t.note else "")) for t in trials]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows])


def totals(trials: list[RestartTrial], total_steps: int, reference: Reference) -> str:
    ok = sum(1 for t in trials if t.verdict(total_steps) == "ok")
    lost = [t.lost_s for t in trials]
    restarts = [t.restart_s for t in trials if t.restart_s is not None]
    returned = [t for t in trials if t.fault == "return"]
    flaps = [t.grows for t in trials if t.fault == "flap"]
    return (f"{len(trials)} trials, {ok} ok; reference job {reference.wall_s:.1f} s ({reference.step_s:.2f} s a step); "
            f"time lost {min(lost):.1f}-{max(lost):.1f} s (median {sorted(lost)[len(lost) // 2]:.1f})"
            + (f", restart {min(restarts):.1f}-{max(restarts):.1f} s" if restarts else "")
            + f"; weights equal in {sum(t.weights_equal for t in trials)}"
            + (f", {sum(t.resized for t in trials)} resized" if any(t.resized for t in trials) else "")
            + (f"; return: {sum(t.ended_full for t in returned)} of {len(returned)} ended on the full size"
               if returned else "")
            + (f"; flap: {max(flaps)} grows at most" if flaps else "")
            + f"; processes left: {sum(t.left for t in trials)}")


def write_results(out: Path, trials: list[RestartTrial], total_steps: int, reference: Reference) -> str:
    """The table and totals to soak.txt, the rows to soak.json; the text."""
    text = format_table(trials, total_steps) + "\n\n" + totals(trials, total_steps, reference)
    (out / "soak.txt").write_text(text + "\n")
    (out / "soak.json").write_text(json.dumps({"reference": asdict(reference), "trials": [
        {**asdict(t), "ended_full": t.ended_full, "verdict": t.verdict(total_steps)} for t in trials]}, indent=2))
    return text


def soak_restarts(args) -> int:
    faults = [f.strip() for f in args.faults.split(",") if f.strip()] if args.faults else list(FAULTS)
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise UserError(f"--faults {args.faults!r} names {', '.join(unknown)}, which is not a fault of the restart "
                        f"soak; choose from {', '.join(FAULTS)}.")
    out = Path(args.out).resolve()
    rng = random.Random(args.seed)
    trials: list[RestartTrial] = []
    with hosts_and_server(args, out, "python -m mpi_train soak --restart") as (hosts, setting, server):
        print("soak: the reference job, without a fault", flush=True)
        reference = run_reference(args, hosts, setting, server, out / "reference")
        print(f"soak:   {reference.wall_s:.1f} s, {reference.step_s:.2f} s a step", flush=True)
        for number in range(1, args.trials + 1):
            trial = draw(number, rng, faults, args)
            print(f"soak: trial {number}/{args.trials}: {trial.fault} ({trial.target}) at step {trial.step}",
                  flush=True)
            run_trial(trial, args, hosts, setting, server, out / f"trial-{number:02d}", reference)
            trials.append(trial)
            print(f"soak:   exit {trial.exit}, {trial.attempts} attempt(s) on {trial.sizes or '?'} ranks, "
                  f"{trial.grows} grow(s), lost {trial.lost_s:.1f} s, {trial.verdict(args.steps)}", flush=True)
            text = write_results(out, trials, args.steps, reference)  # after each trial: an interrupted soak keeps it
    print("\n" + text)
    print(f"soak: table in {out / 'soak.txt'}, rows in {out / 'soak.json'}")
    return 0 if all(t.verdict(args.steps) == "ok" for t in trials) else 1
