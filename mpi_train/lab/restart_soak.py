"""`python -m mpi_train soak --restart`: supervised jobs on test hosts, one random fault each, and how they carried on.

Each trial runs one job under `python -m mpi_train supervise --max-restarts 2` with a
checkpoint every --checkpoint-every steps and `--resume auto`, and at a random step does one of:

  kill    SIGKILL to a random rank
  stop    SIGSTOP to a random rank (a hang: the others give up after --timeout)
  link    a random host's link down for LINK_DOWN_S seconds, then up again
  term    SIGTERM to a random rank

Before the trials, the same job runs once without a fault: its final weights, wall time and
step time are the reference. A trial is `ok` when the supervised job exits 0 having trained
its last step; its final weights equal the reference's bit for bit; its MLflow parent run is
the only one of its name, FINISHED, with each step's loss exactly once; the time it lost
(its wall time less the reference's) is at most its restart time (from the fault to the
relaunched job's first step) plus one checkpoint interval (of the reference's steps) plus
SLACK_S; and nothing of it is left running.
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
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import TrainConfig
from ..errors import UserError
from ..tracking import names
from ..tracking.store import mlflow_client
from . import mpirun
from .network import NetworkSetting
from .soakparts import Server, end_leftovers, hosts_and_server, processes_of, rank_pid
from .testhosts import TestHosts

FAULTS = ("kill", "stop", "link", "term")
LINK_DOWN_S = 20.0
MAX_RESTARTS, BACKOFF_S = 2, 2.0
SLACK_S = 2.0  # of the time-lost bound: the jitter of a relaunch's start-up
EXPERIMENT = "soak-restart"
STEP_LINE = re.compile(r"step\s+(\d+)/(\d+)\b")
RELAUNCHED = "relaunching with --resume auto"  # the supervisor's word that a failed attempt is started again


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
    parent_runs: int = 0
    run_status: str = "?"
    loss_steps: str = "?"  # "ok" when each step's loss is there exactly once, else what is wrong
    wall_s: float = 0.0
    lost_s: float = 0.0
    restart_s: float | None = None  # fault to the relaunched job's first step, less one step
    interval_s: float = 0.0  # one checkpoint interval of the reference's steps
    left: int = 0
    note: str = ""

    def verdict(self, total_steps: int) -> str:
        problems = []
        if self.exit != 0:
            problems.append("NOT FINISHED" if self.exit is not None else "HANG")
        if self.last_step != total_steps:
            problems.append(f"LAST STEP {self.last_step}")
        if not self.weights_equal:
            problems.append("WEIGHTS DIFFER")
        if self.parent_runs != 1 or self.run_status != "FINISHED":
            problems.append(f"RUNS {self.parent_runs} {self.run_status}")
        if self.loss_steps != "ok":
            problems.append(f"LOSSES {self.loss_steps}")
        if self.restart_s is None or self.lost_s > self.restart_s + self.interval_s + SLACK_S:
            problems.append("SLOW")
        if self.left:
            problems.append("LEFT BEHIND")
        return ", ".join(problems) or "ok"


@dataclass(frozen=True)
class Reference:
    """The job without a fault."""

    weights_sha256: str
    wall_s: float
    step_s: float


def job_line(args, hostfile: Path, folder: Path, uri: str, run_name: str) -> list[str]:
    world = args.hosts * args.ranks_per_host
    return ["mpirun", "-np", str(world), "--hostfile", str(hostfile), sys.executable, "-m", "mpi_train",
            "--dataset", "synthetic", "--synthetic-size", str(64 * args.steps), "--batch-size", "64",  # one epoch
            "--log-every", "1", "--max-steps", str(args.steps), "--timeout", str(args.timeout),
            "--sync", TrainConfig.sync,
            "--checkpoint-dir", str(folder / "checkpoints"), "--checkpoint-every", str(args.checkpoint_every),
            "--tracking-uri", uri, "--experiment", EXPERIMENT, "--run-name", run_name,
            "--summary-json", str(folder / "summary.json")]


class Supervised:
    """The supervisor around a job line, its output lines kept with the time each arrived."""

    def __init__(self, line: list[str], env: dict, folder: Path):
        command = [sys.executable, "-m", "mpi_train", "supervise", "--max-restarts", str(MAX_RESTARTS), "--backoff",
                   str(BACKOFF_S), "--host-wait", "60", "--", *line]
        self.lines: list[tuple[float, str]] = []
        self.started = time.monotonic()
        self.process = mpirun.start(command, env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace", bufsize=1)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for text in self.process.stdout:
            self.lines.append((time.monotonic(), text))

    def steps(self) -> list[int]:
        return [int(found.group(1)) for _, text in list(self.lines) for found in [STEP_LINE.search(text)] if found]

    def first_relaunched_step_at(self) -> float | None:
        """When the first step after a relaunch was printed."""
        relaunched = False
        for at, text in list(self.lines):
            relaunched = relaunched or RELAUNCHED in text
            if relaunched and STEP_LINE.search(text):
                return at
        return None

    def output(self) -> str:
        return "".join(text for _, text in self.lines)


def launch_env(setting: NetworkSetting) -> dict:
    return {**os.environ, **mpirun.OPEN_MPI_ENV, "PYTHONUNBUFFERED": "1", **TestHosts.launch_env(setting),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def run_reference(args, hosts: TestHosts, setting: NetworkSetting, server: Server, folder: Path) -> Reference:
    """The same supervised job without a fault, so that the time a trial lost is the fault's alone."""
    folder.mkdir(parents=True, exist_ok=True)
    line = job_line(args, hosts.hostfile(args.hosts, args.ranks_per_host), folder, server.uri, "reference")
    with mpirun.own_tmpdir() as tmpdir:
        job = Supervised(line, {**launch_env(setting), **tmpdir}, folder)
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
    return Reference(summary["weights_sha256"], wall, summary["mean_times_after_warmup"]["step_time_s"])


def run_trial(trial: RestartTrial, args, hosts: TestHosts, setting: NetworkSetting, server: Server, folder: Path,
              reference: Reference) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    marker = str(folder)
    run_name = f"trial-{trial.number:02d}"
    line = job_line(args, hosts.hostfile(args.hosts, args.ranks_per_host), folder, server.uri, run_name)
    trial.interval_s = args.checkpoint_every * reference.step_s
    with ExitStack() as stack:
        env = {**launch_env(setting), **stack.enter_context(mpirun.own_tmpdir())}
        if trial.fault == "link":
            stack.callback(hosts.link, trial.target.split()[-1], "up")
        job = Supervised(line, env, folder)
        stack.callback(end_leftovers, marker, job.process.pid)  # on every way out, Ctrl-C included, after the stop
        stack.callback(mpirun.stop, job.process)
        deadline = time.monotonic() + 180
        while trial.step not in job.steps() and job.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        fault_at = time.monotonic()
        if trial.step not in job.steps():
            trial.note = f"the job never reached step {trial.step}"
        else:
            link_back = inject(trial, marker, hosts)
            if link_back:
                stack.callback(link_back.cancel)
        try:
            trial.exit = job.process.wait(600)
        except subprocess.TimeoutExpired:
            trial.note = "still running 600 s after the fault; stopped"
        trial.wall_s = time.monotonic() - job.started
        mpirun.stop(job.process)
        job.reader.join(10)
        time.sleep(2)  # what the launch's end leaves to exit on its own
        trial.left = len(processes_of(marker))
    (folder / "output.txt").write_text(job.output())
    again_at = job.first_relaunched_step_at()
    if again_at is not None:
        trial.restart_s = again_at - fault_at - reference.step_s
    trial.lost_s = trial.wall_s - reference.wall_s
    trial.attempts = job.output().count(RELAUNCHED) + 1
    steps = job.steps()
    trial.last_step = max(steps) if steps else 0
    summary = folder / "summary.json"
    trial.weights_equal = summary.exists() and \
        json.loads(summary.read_text()).get("weights_sha256") == reference.weights_sha256
    trial.parent_runs, trial.run_status, trial.loss_steps = tracked(server.uri, run_name, args.steps)


def inject(trial: RestartTrial, marker: str, hosts: TestHosts) -> threading.Timer | None:
    """The fault; for a link, the timer that brings it back up."""
    if trial.fault == "link":
        host = trial.target.split()[-1]
        hosts.link(host, "down")
        back = threading.Timer(LINK_DOWN_S, hosts.link, (host, "up"))
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
    target = f"host {args.prefix}{rng.randrange(1, args.hosts + 1)}" if fault == "link" else \
        f"rank {rng.randrange(world)}"
    return RestartTrial(number, fault, target, rng.randint(2, args.steps - 3))


COLUMNS = ("trial", "fault", "target", "step", "exit", "tries", "last", "weights", "run", "losses", "lost_s",
           "restart_s", "bound_s", "left", "verdict")


def format_table(trials: list[RestartTrial], total_steps: int) -> str:
    rows = [(str(t.number), t.fault, t.target, str(t.step), "-" if t.exit is None else str(t.exit), str(t.attempts),
             str(t.last_step), "equal" if t.weights_equal else "DIFFER", f"{t.parent_runs} {t.run_status}",
             t.loss_steps, f"{t.lost_s:.1f}", "-" if t.restart_s is None else f"{t.restart_s:.1f}",
             "-" if t.restart_s is None else f"{t.restart_s + t.interval_s + SLACK_S:.1f}", str(t.left),
             t.verdict(total_steps) + (f" ({t.note})" if t.note else "")) for t in trials]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows])


def totals(trials: list[RestartTrial], total_steps: int, reference: Reference) -> str:
    ok = sum(1 for t in trials if t.verdict(total_steps) == "ok")
    lost = [t.lost_s for t in trials]
    restarts = [t.restart_s for t in trials if t.restart_s is not None]
    return (f"{len(trials)} trials, {ok} ok; reference job {reference.wall_s:.1f} s ({reference.step_s:.2f} s a step); "
            f"time lost {min(lost):.1f}-{max(lost):.1f} s (median {sorted(lost)[len(lost) // 2]:.1f})"
            + (f", restart {min(restarts):.1f}-{max(restarts):.1f} s" if restarts else "")
            + f"; weights equal in {sum(t.weights_equal for t in trials)}, processes left: "
              f"{sum(t.left for t in trials)}")


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
            print(f"soak:   exit {trial.exit}, {trial.attempts} attempt(s), lost {trial.lost_s:.1f} s, "
                  f"{trial.verdict(args.steps)}", flush=True)
    text = format_table(trials, args.steps) + "\n\n" + totals(trials, args.steps, reference)
    print("\n" + text)
    (out / "soak.txt").write_text(text + "\n")
    (out / "soak.json").write_text(json.dumps({"reference": asdict(reference), "trials": [
        {**asdict(t), "verdict": t.verdict(args.steps)} for t in trials]}, indent=2))
    print(f"soak: table in {out / 'soak.txt'}, rows in {out / 'soak.json'}")
    return 0 if all(t.verdict(args.steps) == "ok" for t in trials) else 1
