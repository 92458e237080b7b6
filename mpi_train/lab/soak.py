"""`python -m mpi_train soak --trials N`: short jobs on test hosts, one random fault each, and what it did.

Each trial trains a few steps on test hosts (network namespaces with tc-shaped links; needs
root, see docs/network-lab.md, "Test hosts") with an MLflow server on the hosts' bridge, and at a
random step does one of:

  kill    SIGKILL to a random rank            the job must end FAILED (KILLED: rank 0, which cannot tell)
  stop    SIGSTOP to a random rank            a hang: the others must give up after --timeout
  link    a random host's link taken down     a pulled cable: the host must be named unreachable
  server  the MLflow server stopped, restarted OUTAGE_S later: the job must finish, and once what it
          spooled meanwhile is replayed (python -m mpi_train replay), nothing is lost

and prints one row per trial: the fault, its step, the seconds from fault to mpirun's exit,
the exit status, the run's status in MLflow, the steps whose loss reached MLflow out of those
printed, and the job's processes left behind on any host. A row is `ok` when the job ended
within --timeout + 15 s of the fault (a failure) or finished (a server outage), the run's
status says so, no printed step is missing from MLflow, and nothing is left. Hosts, server and
leftovers are removed on every exit path, Ctrl-C included.

With --bad-input it runs instead each fault a user can cause (a resume with another optimizer, a
full disk, a corrupt image, a cut spool, a damaged store, a loss that becomes non-finite, ...)
as a real np 2 job on this host, from a fresh folder, and prints whether each ended as the
project's standard demands: a non-zero exit, no traceback, a message that names the cause,
nothing left running, nothing half-written (see mpi_train/lab/bad_input.py; as root).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import TrainConfig
from ..errors import ArgumentParser, UserError, format_error
from ..files import unwritable
from ..tracking import names
from ..tracking.store import mlflow_client
from . import bad_input, mpirun
from .network import NetworkSetting, link_error, prefix_error, subnet_error
from .restart_soak import soak_restarts
from .soakparts import Server, end_leftovers, hosts_and_server, processes_of, rank_pid
from .testhosts import TestHosts

FAULTS = ("kill", "stop", "link", "server")
GRACE_S = 15  # a failed job must end within --timeout + GRACE_S of the fault
# How each fault's job must end, and its run. A killed rank 0 cannot say why it died: its run guard ends the run
# KILLED, as for a kill by hand or an out-of-memory kill (see tracking/guard.py).
EXPECTED = {"kill": ("failed", ("FAILED", "KILLED")), "stop": ("failed", ("FAILED",)), "link": ("failed", ("FAILED",)),
            "server": ("finished", ("FINISHED",))}
SETTLE_S = 60  # for the run guard of a killed rank 0 to end its runs


@dataclass
class Trial:
    """One job and its fault, and what came of it."""

    number: int
    fault: str
    target: str  # "rank 3", "host soak2", "server"
    step: int
    end_s: float | None = None  # fault to mpirun's exit
    exit: int | None = None
    run_status: str = "?"
    logged: int = 0  # printed steps whose loss reached MLflow
    printed: int = 0
    left: int = 0  # processes of the job alive after it ended
    note: str = ""

    def verdict(self, timeout_s: int) -> str:
        outcome, statuses = EXPECTED[self.fault]
        problems = []
        if self.exit is None:
            problems.append("HANG")
        elif outcome == "failed" and (self.exit == 0 or self.end_s > timeout_s + GRACE_S):
            problems.append("LATE" if self.exit else "NOT FAILED")
        elif outcome == "finished" and self.exit != 0:
            problems.append("FAILED")
        if self.run_status not in statuses:
            problems.append(f"RUN {self.run_status}")
        if self.logged < self.printed:
            problems.append("LOST METRICS")
        if self.left:
            problems.append("LEFT BEHIND")
        return ", ".join(problems) or "ok"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m mpi_train soak", description=__doc__.split("\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--restart", action="store_true",
                        help="the restart soak: each job under python -m mpi_train supervise --max-restarts 2 with "
                             "checkpoints, which must carry on to its last step with the faultless job's weights "
                             "(faults: kill, stop, link, term, return, flap; see mpi_train/lab/restart_soak.py)")
    parser.add_argument("--bad-input", action="store_true",
                        help="the probe of user-caused faults: each case a real np 2 job on this host, held to the "
                             "standard (non-zero exit, no traceback, the cause named, nothing left running or "
                             "half-written); --faults picks cases, the rest of the flags do not apply (see "
                             "mpi_train/lab/bad_input.py)")
    parser.add_argument("--trials", type=int, default=10, help="jobs to run, one fault each (default: 10)")
    parser.add_argument("--faults", default=None,
                        help=f"faults to draw from (default: {','.join(FAULTS)}; with --restart: "
                             f"kill,stop,link,term,return,flap; with --bad-input: the cases to run, e.g. "
                             f"lr-inf,full-disk-cache, default all)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the draws: faults, ranks, hosts, steps (default: 0)")
    parser.add_argument("--hosts", type=int, default=2, help="test hosts (default: 2)")
    parser.add_argument("--ranks-per-host", type=int, default=2, help="ranks on each host (default: 2)")
    parser.add_argument("--link", default=None,
                        help="every host's link rate: about a second per step at 50mbit (default: 50mbit; with "
                             "--restart: 100mbit)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps of each job (default: 12; with --restart: 20)")
    parser.add_argument("--checkpoint-every", type=int, default=5,
                        help="with --restart: steps between the jobs' checkpoints (default: 5)")
    parser.add_argument("--timeout", type=int, default=15, help="the jobs' --timeout in seconds (default: 15)")
    parser.add_argument("--prefix", default="soak", help="the test hosts' names (default: soak, so soak1, soak2, ...)")
    parser.add_argument("--subnet", default="10.87.0", help="the test hosts' /24 network (default: 10.87.0)")
    parser.add_argument("--out", default="soak",
                        help="folder for the jobs' output, the MLflow store and the table (default: soak)")
    return parser


def fill_defaults(args: argparse.Namespace) -> None:
    """The defaults that depend on --restart."""
    if args.steps is None:
        args.steps = 20 if args.restart else 12
    if args.link is None:
        args.link = "100mbit" if args.restart else "50mbit"


def validate(args: argparse.Namespace) -> list[str]:
    """The faults to draw from."""
    fill_defaults(args)
    faults = [f.strip() for f in (args.faults or ",".join(FAULTS)).split(",") if f.strip()]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown or not faults:
        raise UserError(f"--faults {args.faults!r} names {', '.join(unknown) or 'nothing'}, which is not a fault here; "
                        f"choose from {', '.join(FAULTS)}.")
    for flag, problem in (("--link", link_error(args.link)), ("--prefix", prefix_error(args.prefix)),
                          ("--subnet", subnet_error(args.subnet))):
        if problem:  # before test hosts are made: the script's own refusal names its variables, not the flag
            raise UserError(f"{flag}: {problem}")
    if args.trials < 1 or args.hosts < 2 or args.ranks_per_host < 1 or args.steps < 6 or args.timeout < 5:
        raise UserError("--trials must be at least 1, --hosts at least 2, --ranks-per-host at least 1, --steps at "
                        "least 6 and --timeout at least 5 seconds; every fault needs a job that spans hosts and has "
                        "steps before and after it.")
    return faults


def run_trial(trial: Trial, args, hosts: TestHosts, setting: NetworkSetting, server: Server, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    marker = str(folder)
    world = args.hosts * args.ranks_per_host
    hostfile = hosts.hostfile(args.hosts, args.ranks_per_host)
    command = ["mpirun", "-np", str(world), "--hostfile", str(hostfile), sys.executable, "-m", "mpi_train",
               "--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "1",
               "--max-steps", str(args.steps), "--timeout", str(args.timeout), "--sync", TrainConfig.sync,
               "--tracking-uri", server.uri, "--experiment", "soak", "--run-name", f"trial-{trial.number:02d}",
               "--summary-json", str(folder / "summary.json")]
    env = {**os.environ, **mpirun.OPEN_MPI_ENV, "PYTHONUNBUFFERED": "1", **TestHosts.launch_env(setting),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    lines: list[str] = []
    with ExitStack() as stack:
        env.update(stack.enter_context(mpirun.own_tmpdir()))
        if trial.fault == "link":
            stack.callback(hosts.link, trial.target.split()[-1], "up")
        process = mpirun.start(command, env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stack.callback(end_leftovers, marker, process.pid)  # on every way out (Ctrl-C included), after the stop
        stack.callback(mpirun.stop, process)
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        printed = lambda: [int(s) for s in re.findall(rf"step\s+(\d+)/{args.steps}\b", "".join(lines))]
        deadline = time.monotonic() + 180
        while trial.step not in printed() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if trial.step not in printed():
            trial.note = f"the job never reached step {trial.step}"
        else:
            inject(trial, marker, hosts, server)
        injected = time.monotonic()
        bound = 180 if trial.fault == "server" else args.timeout + GRACE_S + 45
        try:
            trial.exit = process.wait(bound)
            trial.end_s = time.monotonic() - injected
        except subprocess.TimeoutExpired:
            trial.note = f"still running {bound} s after the fault; stopped"
        mpirun.stop(process)
        reader.join(10)
        time.sleep(2)  # what mpirun's end leaves to exit on its own
        trial.left = len(processes_of(marker, process.pid))
    (folder / "output.txt").write_text("".join(lines))
    server.wait_up()
    spool = folder / "mlruns" / "spool"
    if any(spool.glob("*.jsonl")):  # written while the server was away: sent as the job's message says to
        replay = subprocess.run([sys.executable, "-m", "mpi_train", "replay", "--tracking-uri", server.uri, str(spool)],
                                capture_output=True, text=True, timeout=300,
                                env={k: v for k, v in env.items() if k != "TMPDIR"}, check=False)
        trial.note = "spool replayed" if replay.returncode == 0 else f"replay failed: {replay.stderr.strip()[-200:]}"
    trial.printed = len(set(printed()))
    trial.run_status, trial.logged = tracked(server.uri, f"trial-{trial.number:02d}", set(printed()))


def inject(trial: Trial, marker: str, hosts: TestHosts, server: Server) -> None:
    if trial.fault in ("kill", "stop"):
        pid = rank_pid(marker, int(trial.target.split()[-1]))
        if pid is None:
            trial.note = f"{trial.target} was not found"
            return
        os.kill(pid, signal.SIGKILL if trial.fault == "kill" else signal.SIGSTOP)
    elif trial.fault == "link":
        hosts.link(trial.target.split()[-1], "down")
    else:
        server.outage()


def tracked(uri: str, run_name: str, printed: set) -> tuple[str, int]:
    """The job's parent run status once it has one (or RUNNING after SETTLE_S), and how many printed steps have
    their loss in MLflow."""
    client = mlflow_client(uri)
    deadline = time.monotonic() + SETTLE_S
    while True:
        experiment = client.get_experiment_by_name("soak")
        where = f"tags.`mpi_train.role` = 'job' and attributes.run_name = '{run_name}'"
        runs = client.search_runs([experiment.experiment_id], where) if experiment else []
        if runs and runs[0].info.status != "RUNNING" or time.monotonic() > deadline:
            break
        time.sleep(1)
    if not runs:
        return "none", 0
    logged = {m.step for m in client.get_metric_history(runs[0].info.run_id, names.LOSS)}
    return runs[0].info.status, len(printed & logged)


def draw(number: int, rng: random.Random, faults: list[str], args) -> Trial:
    fault = rng.choice(faults)
    target = {"kill": lambda: f"rank {rng.randrange(args.hosts * args.ranks_per_host)}",
              "stop": lambda: f"rank {rng.randrange(args.hosts * args.ranks_per_host)}",
              "link": lambda: f"host {args.prefix}{rng.randrange(1, args.hosts + 1)}",
              "server": lambda: "server"}[fault]()
    return Trial(number, fault, target, rng.randint(2, args.steps - 3))


COLUMNS = ("trial", "fault", "target", "step", "end_s", "exit", "run", "metrics", "left", "verdict")


def format_table(trials: list[Trial], timeout_s: int) -> str:
    rows = [(str(t.number), t.fault, t.target, str(t.step), "-" if t.end_s is None else f"{t.end_s:.1f}",
             "-" if t.exit is None else str(t.exit), t.run_status, f"{t.logged}/{t.printed}", str(t.left),
             t.verdict(timeout_s) + (f" ({t.note})" if t.note else "")) for t in trials]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows])


def totals(trials: list[Trial], timeout_s: int) -> str:
    bad = [t for t in trials if t.verdict(timeout_s) != "ok"]
    failed_ends = [t.end_s for t in trials if EXPECTED[t.fault][0] == "failed" and t.end_s is not None]
    hangs = sum(1 for t in trials
                if t.exit is None or (EXPECTED[t.fault][0] == "failed" and t.end_s > timeout_s + GRACE_S))
    return (f"{len(trials)} trials, {len(trials) - len(bad)} ok; hangs past the bound: {hangs}, "
            f"lost metrics: {sum(t.printed - t.logged for t in trials)} step(s), "
            f"processes left: {sum(t.left for t in trials)}"
            + (f"; failed jobs ended {min(failed_ends):.1f}-{max(failed_ends):.1f} s after the fault (bound "
               f"{timeout_s + GRACE_S} s)" if failed_ends else ""))


def soak(args: argparse.Namespace) -> int:
    if problem := unwritable([("--out", args.out, True)]):  # before test hosts are made for it
        raise UserError(f"{problem} Nothing was run.")
    if args.bad_input:
        return bad_input.probe(args)
    fill_defaults(args)
    if args.restart:
        validate(argparse.Namespace(**{**vars(args), "faults": "kill"}))  # the shared bounds
        if args.checkpoint_every < 1 or args.steps < 2 * args.checkpoint_every:
            raise UserError(f"--checkpoint-every {args.checkpoint_every} with --steps {args.steps}: the restart soak "
                            f"needs a checkpoint every 1 or more steps and at least two of them in a job.")
        return soak_restarts(args)
    faults = validate(args)
    out = Path(args.out).resolve()
    rng = random.Random(args.seed)
    trials: list[Trial] = []
    with hosts_and_server(args, out, "python -m mpi_train soak") as (hosts, setting, server):
        for number in range(1, args.trials + 1):
            trial = draw(number, rng, faults, args)
            print(f"soak: trial {number}/{args.trials}: {trial.fault} ({trial.target}) at step {trial.step}",
                  flush=True)
            run_trial(trial, args, hosts, setting, server, out / f"trial-{number:02d}")
            trials.append(trial)
            print(f"soak:   ended {'-' if trial.end_s is None else f'{trial.end_s:.1f} s'} after the fault, exit "
                  f"{trial.exit}, run {trial.run_status}, metrics {trial.logged}/{trial.printed}, left {trial.left}: "
                  f"{trial.verdict(args.timeout)}", flush=True)
    text = format_table(trials, args.timeout) + "\n\n" + totals(trials, args.timeout)
    print("\n" + text)
    (out / "soak.txt").write_text(text + "\n")
    (out / "soak.json").write_text(json.dumps([{**asdict(t), "verdict": t.verdict(args.timeout)} for t in trials],
                                              indent=2))
    print(f"soak: table in {out / 'soak.txt'}, rows in {out / 'soak.json'}")
    return 0 if all(t.verdict(args.timeout) == "ok" for t in trials) else 1


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a kill of the soak cleans up as Ctrl-C does
    try:
        return soak(args)
    except UserError as error:
        print(format_error(str(error)), file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("soak: interrupted; the test hosts, the server and the jobs are removed.", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
