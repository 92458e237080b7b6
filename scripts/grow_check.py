"""The grow-back targets of issue #56 on 3 test hosts of 1 rank each, measured, for docs/results.md.

Each job trains VGG-11 on synthetic data (1 thread a rank) under `python -m mpi_train supervise --min-ranks 2
--host-wait 3 --host-cooldown C --max-restarts 2`, a checkpoint every 5 steps, tracked by an MLflow server on the
hosts' bridge. The same job uninterrupted on 3 ranks gives the reference losses; then host 3's link is cut:
  a  after the first checkpoint; back once the job trains on 2 ranks: on 3 ranks again within the cooldown + the
     grow's relaunch + 5 s of the link coming up, FINISHED in one run with each loss once, the final loss the
     reference's to 1e-3 relative (beside it, how far the reference itself moves with --sync ring: float rounding
     alone), nothing left running
  b  before the first checkpoint: on 2 ranks from step 0 within --timeout + --host-wait + 30 s of the cut
  c  as in a, then the link flaps (up 5 s, down 5 s, ten times) while the job runs on 2 ranks: at most 2 grows
One row per check (measured, target, verdict); each job's timed output stays in --out. Needs root, ip and tc
(docs/network-lab.md, "Test hosts"); hosts, server and jobs are removed on every way out, Ctrl-C included.

    PYTHONPATH=. python scripts/grow_check.py --out /tmp/grow-check     # about 19 minutes on 2 cores
    PYTHONPATH=. python scripts/grow_check.py --scenarios ""            # the hosts and the reference alone
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from mpi_train.errors import UserError, format_error
from mpi_train.lab import mpirun
from mpi_train.lab.growth import STEP_LINE
from mpi_train.lab.restart_soak import launch_env
from mpi_train.lab.soakparts import end_leftovers, hosts_and_server, processes_of
from mpi_train.tracking import names
from mpi_train.tracking.store import mlflow_client

EXPERIMENT = "grow-check"
SCENARIOS = ("a", "b", "c")
BANNER = re.compile(r"^mpi_train: (\d+) rank\(s\) on ")  # each attempt's first line: its world size
# the supervisor's decision: `Host(s) H returned ready: ...; against a relaunch of Y s (measured): growing.`
DECISION = re.compile(r"mpi_train supervise: .+? ready: step .*?\b(growing|not growing)\.")
RELAUNCH_COST = re.compile(r"relaunch of ([\d.]+) s \((measured|stated|assumed)")
GROWN = re.compile(r"mpi_train supervise: the job stopped at step \d+ to grow")  # a grow carried out
LOSS_RTOL, MAX_GROWS_FLAPPING = 1e-3, 2  # of targets a and c
FLAP_S, FLAPS = 5.0, 10
GROW_SLACK_S = 5.0  # of target a: link up to the first step at 3 ranks within cooldown + relaunch + this
RESTART_SLACK_S = 30.0  # of target b: cut to the first step at 2 ranks within --timeout + --host-wait + this
JOB_LIMIT_S = 600.0  # one scenario's job, start to end


@dataclass(frozen=True)
class Attempt:
    """One launch of the job as its output shows it: its world size, when its banner and its first step came."""

    world: int
    started_at: float
    first_step: int | None
    first_step_at: float | None


@dataclass(frozen=True)
class Decision:
    """One of the supervisor's grow decisions."""

    at: float
    grows: bool
    relaunch_s: float | None
    relaunch_kind: str | None  # "measured", "stated" (--relaunch-cost) or "assumed"


def attempts_of(lines: list[tuple[float, str]]) -> list[Attempt]:
    """The job's attempts, in order, from its timed output lines."""
    found: list[dict] = []
    for at, text in lines:
        banner = BANNER.match(text)
        if banner:
            found.append({"world": int(banner.group(1)), "started_at": at, "first_step": None, "first_step_at": None})
            continue
        step = STEP_LINE.search(text)
        if step and found and found[-1]["first_step"] is None:
            found[-1].update(first_step=int(step.group(1)), first_step_at=at)
    return [Attempt(**attempt) for attempt in found]


def decisions_of(lines: list[tuple[float, str]]) -> list[Decision]:
    """The supervisor's grow decisions, in order."""
    found = [(at, DECISION.search(text), RELAUNCH_COST.search(text)) for at, text in lines]
    return [Decision(at, made.group(1) == "growing", float(cost.group(1)) if cost else None,
                     cost.group(2) if cost else None) for at, made, cost in found if made]


def first_attempt_after(attempts: list[Attempt], since: float, world: int) -> Attempt | None:
    """The first attempt of `world` ranks started after `since` that trained a step."""
    return next((a for a in attempts if a.started_at >= since and a.world == world and a.first_step_at), None)


def relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@dataclass
class Check:
    """One row of the table: what was measured against what the issue asks."""

    scenario: str
    what: str
    measured: str
    target: str
    ok: bool
    note: str = ""

    @property
    def verdict(self) -> str:
        return ("ok" if self.ok else "MISSED") + (f" ({self.note})" if self.note else "")


def format_table(checks: list[Check]) -> str:
    columns = ("scenario", "check", "measured", "target", "verdict")
    rows = [(c.scenario, c.what, c.measured, c.target, c.verdict) for c in checks]
    widths = [max(len(name), *(len(row[i]) for row in rows)) if rows else len(name) for i, name in enumerate(columns)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in rows])


@dataclass
class Scenario:
    """One supervised job and the link events done to it, with their times."""

    name: str
    events: dict[str, float] = field(default_factory=dict)
    lines: list[tuple[float, str]] = field(default_factory=list)
    exit: int | None = None
    left: int = 0
    run: Tracked | None = None  # its MLflow parent run, read once the job has ended


class Watched:
    """A supervised job whose output lines are kept with the time each arrived."""

    def __init__(self, command: list[str], env: dict, cwd: Path, lines: list[tuple[float, str]]):
        self.lines = lines
        self.process = mpirun.start(command, env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace", bufsize=1)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for text in self.process.stdout:
            self.lines.append((time.monotonic(), text.rstrip("\n")))

    def wait_until(self, condition, timeout_s: float, what: str) -> float:
        """When `condition()` first held; the job's end or the time limit first raise, naming `what`."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.process.poll() is not None:
                raise TimeoutError(f"the job ended (exit {self.process.returncode}) before {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout_s:g} s")
            time.sleep(0.05)
        return time.monotonic()

    def printed_step(self, step: int) -> bool:
        return any((found := STEP_LINE.search(text)) and int(found.group(1)) == step for _, text in list(self.lines))

    def shrunk_since(self, since: float) -> bool:
        return first_attempt_after(attempts_of(list(self.lines)), since, 2) is not None


def job_line(args, hostfile: Path, folder: Path, uri: str, run_name: str) -> list[str]:
    steps = scenario_steps(run_name, args)
    return ["mpirun", "-np", "3", "--hostfile", str(hostfile), sys.executable, "-m", "mpi_train",
            "--model", "vgg11", "--dataset", "synthetic", "--synthetic-size", str(args.batch_size * steps),
            "--batch-size", str(args.batch_size), "--max-steps", str(steps), "--log-every", "1", "--threads", "1",
            "--timeout", str(args.timeout), "--checkpoint-dir", str(folder / "checkpoints"),
            "--checkpoint-every", str(args.checkpoint_every), "--tracking-uri", uri, "--experiment", EXPERIMENT,
            "--run-name", run_name, "--summary-json", str(folder / "summary.json"), *shlex.split(args.train_flags)]


def supervisor_line(args, line: list[str]) -> list[str]:
    return [sys.executable, "-m", "mpi_train", "supervise", "--min-ranks", "2", "--host-wait", str(args.host_wait),
            "--host-cooldown", str(args.cooldown), "--max-restarts", "2", "--backoff", str(args.backoff), "--", *line]


def run_reference(args, hosts, setting, server, folder: Path, *flags: str) -> dict:
    """The job on 3 ranks with nothing going wrong, `flags` added: its summary (losses, step time)."""
    folder.mkdir(parents=True, exist_ok=True)
    line = [*job_line(args, hosts.hostfile(3, 1), folder, server.uri, folder.name), *flags]
    done = mpirun.run(line, launch_env(setting), timeout=JOB_LIMIT_S, cwd=folder)
    (folder / "output.txt").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise RuntimeError(f"the {folder.name} job failed (exit {done.returncode}); see {folder / 'output.txt'}")
    return json.loads((folder / "summary.json").read_text())


def cut_until_shrunk(job: Watched, hosts, host: str, events: dict, cut_step: int) -> None:
    """The host's link cut at `cut_step`, for as long as the job takes to go on with 2 ranks."""
    events["cut"] = job.wait_until(lambda: job.printed_step(cut_step), 300, f"step {cut_step}")
    hosts.link(host, "down")
    events["shrunk"] = job.wait_until(lambda: job.shrunk_since(events["cut"]), 300, "a step on 2 ranks")


def cut_then_back(job: Watched, hosts, host: str, events: dict, cut_step: int, args) -> None:
    """Scenarios a and b: the link up again --up-after seconds after the job trains on 2 ranks."""
    cut_until_shrunk(job, hosts, host, events, cut_step)
    time.sleep(args.up_after)
    hosts.link(host, "up")
    events["up"] = time.monotonic()


def cut_then_flap(job: Watched, hosts, host: str, events: dict, cut_step: int, args) -> None:
    """Scenario c: once the job trains on 2 ranks, the link flaps FLAPS times, then stays up."""
    cut_until_shrunk(job, hosts, host, events, cut_step)
    for _ in range(FLAPS):
        if job.process.poll() is not None:
            return
        time.sleep(FLAP_S)
        hosts.link(host, "up")
        time.sleep(FLAP_S)
        hosts.link(host, "down")
    hosts.link(host, "up")
    events["up"] = time.monotonic()


def run_scenario(scenario: Scenario, args, hosts, setting, server, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    host = f"{args.prefix}3"  # the last host: mpirun's rank 2
    line = job_line(args, hosts.hostfile(3, 1), folder, server.uri, scenario.name)
    drive = cut_then_flap if scenario.name == "c" else cut_then_back
    cut_step = args.early_cut_step if scenario.name == "b" else args.cut_step
    started = time.monotonic()
    with ExitStack() as stack:
        env = {**launch_env(setting), **stack.enter_context(mpirun.own_tmpdir())}
        stack.callback(hosts.link, host, "up")
        job = Watched(supervisor_line(args, line), env, folder, scenario.lines)
        stack.callback(end_leftovers, str(folder), job.process.pid)  # after the stop below, on every way out
        stack.callback(mpirun.stop, job.process)
        try:
            drive(job, hosts, host, scenario.events, cut_step, args)
        except TimeoutError as error:
            scenario.lines.append((time.monotonic(), f"grow_check: {error}"))
        try:
            scenario.exit = job.process.wait(max(1.0, JOB_LIMIT_S - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            scenario.lines.append((time.monotonic(), f"grow_check: still running after {JOB_LIMIT_S:g} s; stopped"))
        mpirun.stop(job.process)
        job.reader.join(10)
        time.sleep(2)  # what the launch's end leaves to exit on its own
        scenario.left = len(set(processes_of(str(folder))) | set(pids_on_hosts(args.prefix)))
    (folder / "output.txt").write_text("".join(f"{at - started:9.2f}  {text}\n" for at, text in scenario.lines))


@dataclass(frozen=True)
class Tracked:
    """The scenario's MLflow parent run(s), as the issue checks them."""

    runs: int
    status: str  # of each run, the newest first
    losses: dict[int, list[float]]  # the newest run's  # step: every value logged for it
    world_sizes: list[tuple[int, int]]  # (step, ranks) of time/world_size
    restarts: dict[str, str]  # mpi_train.restart.N tags


def tracked(uri: str, run_name: str) -> Tracked:
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    where = f"tags.`mpi_train.role` = 'job' and attributes.run_name = '{run_name}'"
    runs = client.search_runs([experiment.experiment_id], where) if experiment else []
    if not runs:
        return Tracked(runs=0, status="none", losses={}, world_sizes=[], restarts={})
    run_id, losses = runs[0].info.run_id, {}
    for metric in client.get_metric_history(run_id, names.LOSS):
        losses.setdefault(metric.step, []).append(metric.value)
    sizes = sorted((m.step, int(m.value)) for m in client.get_metric_history(run_id, names.WORLD_SIZE))
    restarts = {k: v for k, v in runs[0].data.tags.items() if k.startswith("mpi_train.restart.")}
    statuses = ", ".join(r.info.status for r in runs)  # the newest first
    return Tracked(runs=len(runs), status=statuses, losses=losses, world_sizes=sizes, restarts=restarts)


def losses_once(losses: dict[int, list[float]], total_steps: int) -> str:
    """"ok" when each step 1..total_steps has exactly one loss, else what is wrong."""
    doubled = sorted(step for step, values in losses.items() if len(values) > 1)
    missing = sorted(set(range(1, total_steps + 1)) - set(losses))
    return ", ".join(filter(None, (f"doubled {doubled}" if doubled else "",
                                   f"missing {missing}" if missing else ""))) or "ok"


def run_checks(scenario: Scenario, run: Tracked, final_loss: float | None, reference: dict, rounding: float | None,
               args) -> list[Check]:
    """What every scenario must show: one FINISHED run, each loss once, the reference's final loss, nothing left.
    `rounding`: how far the reference's final loss moves with another order of the same sum."""
    name, steps = scenario.name, scenario_steps(scenario.name, args)
    sizes = " ".join(f"{step}:{ranks}" for step, ranks in run.world_sizes) or "-"
    reference_losses = {s["step"]: s["loss"] for s in reference["steps"]}
    # the steps the first attempt logged (up to the checkpoint before the cut) were trained on 3 ranks, as the
    # reference's were: they differ by rounding alone
    on_three = args.cut_step // args.checkpoint_every * args.checkpoint_every if name != "b" else 0
    before_cut = [relative(values[0], reference_losses[step]) for step, values in run.losses.items()
                  if step <= on_three and step in reference_losses]
    final = "-" if final_loss is None else f"{relative(final_loss, reference['final_loss']):.2e}"
    checks = [
        Check(scenario=name, what="job and run", target="exit 0, 1 run FINISHED",
              measured=f"exit {scenario.exit}, {run.runs} run(s) {run.status}, world_size {sizes}",
              ok=scenario.exit == 0 and run.runs == 1 and run.status == "FINISHED"),
        Check(scenario=name, what="each step's loss once", measured=losses_once(run.losses, steps),
              target=f"steps 1-{steps} once", ok=losses_once(run.losses, steps) == "ok"),
        Check(scenario=name, what="processes left", measured=str(scenario.left), target="0", ok=scenario.left == 0),
    ]
    if steps == args.steps:  # the reference's length: the same losses are due
        notes = [f"steps 1-{on_three}, 3 ranks in both: at most {max(before_cut):.1e}" if before_cut else "",
                 f"the reference with --sync {args.rounding_sync}, uninterrupted: {rounding:.2e}"
                 if rounding is not None else ""]
        checks.insert(2, Check(scenario=name, what="final loss against the reference's (relative)", measured=final,
                               target=f"<= {LOSS_RTOL:g}",
                               ok=final_loss is not None and relative(final_loss, reference["final_loss"]) <= LOSS_RTOL,
                               note="; ".join(filter(None, notes))))
    return checks


def scenario_steps(name: str, args) -> int:
    """c runs on past its ten flaps; the reference and the others run --steps."""
    return args.flap_steps if name == "c" else args.steps


def grow_check(scenario: Scenario, args) -> Check:
    """Target a: from the link up to the first step on 3 ranks, within the cooldown + the grow's relaunch + 5 s."""
    row = {"scenario": scenario.name, "what": "link up -> first step on 3 ranks"}
    up = scenario.events.get("up", float("inf"))
    grown = first_attempt_after(attempts_of(scenario.lines), up, 3)
    grows = [d for d in decisions_of(scenario.lines) if d.grows and d.at >= up]
    if grown is None or not grows:
        return Check(**row, measured="never", target=f"<= {args.cooldown:g} + relaunch + {GROW_SLACK_S:g} s", ok=False,
                     note=f"{len(grows)} grow decision(s) after the link came up")
    relaunch = grown.first_step_at - grows[0].at
    took, bound = grown.first_step_at - up, args.cooldown + relaunch + GROW_SLACK_S
    return Check(**row, measured=f"{took:.1f} s (decided after {grows[0].at - up:.1f} s, relaunch {relaunch:.1f} s)",
                 target=f"<= {args.cooldown:g} + {relaunch:.1f} + {GROW_SLACK_S:g} = {bound:.1f} s", ok=took <= bound,
                 note=f"resumed at step {grown.first_step - 1}; the supervisor counted a relaunch as "
                      f"{grows[0].relaunch_s} s ({grows[0].relaunch_kind})")


def restart_check(scenario: Scenario, args) -> Check:
    """Target b: from the cut to the first step on 2 ranks, from step 0, within --timeout + --host-wait + 30 s (a cut
    after a checkpoint resumes there, held to the same time)."""
    cut, early = scenario.events.get("cut", float("inf")), scenario.name == "b"
    shrunk = first_attempt_after(attempts_of(scenario.lines), cut, 2)
    bound = args.timeout + args.host_wait + RESTART_SLACK_S
    took = shrunk.first_step_at - cut if shrunk else None
    return Check(scenario=scenario.name, what="cut -> first step on 2 ranks",
                 measured=f"{took:.1f} s, from step {shrunk.first_step - 1}" if shrunk else "never",
                 target=f"<= {args.timeout:g} + {args.host_wait:g} + {RESTART_SLACK_S:g} = {bound:g} s"
                        + (", from step 0" if early else ""),
                 ok=shrunk is not None and took <= bound and (shrunk.first_step == 1 or not early))


def flap_check(scenario: Scenario, args) -> Check:
    """Target c: a host that flaps ten times causes at most 2 grows."""
    made = decisions_of(scenario.lines)
    grows = sum(bool(GROWN.search(text)) for _, text in scenario.lines)
    return Check(scenario=scenario.name, what=f"grows, link flapping {FLAPS} times",
                 measured=f"{grows} (decisions: {sum(d.grows for d in made)} growing, "
                          f"{sum(not d.grows for d in made)} not)", target=f"<= {MAX_GROWS_FLAPPING}",
                 ok=grows <= MAX_GROWS_FLAPPING,
                 note="the job ended before the flapping did" if "up" not in scenario.events else "")


def checks_of(scenario: Scenario, reference: dict, rounding: float | None, uri: str, folder: Path,
              args) -> list[Check]:
    summary = folder / "summary.json"
    final_loss = json.loads(summary.read_text())["final_loss"] if summary.exists() else None
    own = [restart_check(scenario, args), flap_check(scenario, args) if scenario.name == "c" else
           grow_check(scenario, args)]
    scenario.run = tracked(uri, scenario.name)
    return [*own, *run_checks(scenario, scenario.run, final_loss, reference, rounding, args)]


def pids_on_hosts(prefix: str) -> list[int]:
    """Every process inside the test hosts (ranks, launch daemons): none once a job has ended."""
    return [int(pid) for host in namespaces_left(prefix) for pid in subprocess.run(
        ["ip", "netns", "pids", host], capture_output=True, text=True, check=False).stdout.split()]


def namespaces_left(prefix: str) -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in listing.splitlines() if re.match(rf"{re.escape(prefix)}\d+\b", line)]


FLAGS = (  # (flag, type, default, meaning)
    ("--scenarios", str, "a,b,c", "which to run, comma-separated; empty: the reference alone"),
    ("--steps", int, 250, "training steps of the reference and of a and b"),
    ("--flap-steps", int, 300, "training steps of c, which must outlast its cut, shrink and ten flaps"),
    ("--batch-size", int, 24, "the global batch, split by 2 and by 3 ranks"),
    ("--checkpoint-every", int, 5, "steps between checkpoints"),
    ("--cut-step", int, 7, "a and c: the step at which host 3's link is cut, after the first checkpoint"),
    ("--early-cut-step", int, 2, "b: the step at which host 3's link is cut, before the first checkpoint"),
    ("--up-after", float, 3.0, "a and b: seconds after the first step on 2 ranks before the link comes back"),
    ("--timeout", int, 10, "the jobs' --timeout in seconds"),
    ("--host-wait", float, 3.0, "the supervisor's --host-wait"),
    ("--cooldown", float, 10.0, "the supervisor's --host-cooldown"),
    ("--backoff", float, 2.0, "the supervisor's --backoff"),
    ("--link", str, "unlimited", "every host's link rate, e.g. 1gbit; unlimited: unshaped"),
    ("--prefix", str, "grx", "the test hosts' names: grx1..grx3"),
    ("--subnet", str, "10.93.0", "the test hosts' /24 network"),
    ("--out", str, "grow-check", "folder for the jobs' output, the MLflow store and the table"),
    ("--train-flags", str, "", ("more training flags for every job, e.g. '--model mnist_cnn --dropout 0', or "
                                "--train-flags=--sync-bn (one flag alone after =)")),
    ("--rounding-sync", str, "ring", ("the reference run again with this --sync, a lossless method that sums in "
                                      "another order: how far float rounding alone moves its final loss; empty: "
                                      "not run")),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python scripts/grow_check.py", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    for flag, kind, default, meaning in FLAGS:
        parser.add_argument(flag, type=kind, default=default, help=f"{meaning} (default: {default})")
    parser.set_defaults(hosts=3, ranks_per_host=1)  # what the soaks' hosts_and_server reads
    return parser


def check_args(args) -> list[str]:
    """The scenarios asked for; bad flags raise UserError with what to change."""
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise UserError(f"--scenarios {args.scenarios!r} names {', '.join(unknown)}; choose from "
                        f"{', '.join(SCENARIOS)}, or give \"\" for the reference alone.")
    if args.batch_size % 6:
        raise UserError(f"--batch-size {args.batch_size} does not split evenly over both 2 and 3 ranks; give a "
                        f"multiple of 6 (48, 96).")
    if not args.early_cut_step < args.checkpoint_every < args.cut_step < min(args.steps, args.flap_steps):
        raise UserError(f"the cuts must fall on both sides of the first checkpoint and inside the jobs: "
                        f"--early-cut-step {args.early_cut_step} < --checkpoint-every {args.checkpoint_every} < "
                        f"--cut-step {args.cut_step} < --steps {args.steps} and --flap-steps {args.flap_steps}.")
    return scenarios


def measure(args, scenarios: list[str], out: Path) -> tuple[list[Check], dict, float | None, dict]:
    checks: list[Check] = []
    runs: dict[str, Scenario] = {}
    rounding = None
    with hosts_and_server(args, out, "scripts/grow_check.py") as (hosts, setting, server):
        print("grow_check: the reference job, 3 ranks, nothing going wrong", flush=True)
        started = time.monotonic()
        reference = run_reference(args, hosts, setting, server, out / "reference")
        print(f"grow_check:   {time.monotonic() - started:.1f} s", flush=True)
        if args.rounding_sync:
            print(f"grow_check: the reference again with --sync {args.rounding_sync}", flush=True)
            again = run_reference(args, hosts, setting, server, out / "reference-rounding", "--sync",
                                  args.rounding_sync)
            rounding = relative(again["final_loss"], reference["final_loss"])
            print(f"grow_check:   final loss {again['final_loss']:.6f}, {rounding:.2e} from the reference's",
                  flush=True)
        for name in scenarios:
            print(f"grow_check: scenario {name}", flush=True)
            started = time.monotonic()
            runs[name] = Scenario(name)
            run_scenario(runs[name], args, hosts, setting, server, out / name)
            found = checks_of(runs[name], reference, rounding, server.uri, out / name, args)
            checks += found
            print(f"grow_check:   {time.monotonic() - started:.1f} s: "
                  + "; ".join(f"{c.what}: {c.measured} {c.verdict}" for c in found), flush=True)
    left = namespaces_left(args.prefix)
    checks.append(Check(scenario="all", what="test hosts left", measured=" ".join(left) or "none", target="none",
                        ok=not left))
    return checks, reference, rounding, runs


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        scenarios = check_args(args)
        out = Path(args.out).resolve()
        checks, reference, rounding, runs = measure(args, scenarios, out)
    except UserError as error:
        print(format_error(str(error), prog="grow_check"), file=sys.stderr)
        return 2
    return report(args, checks, reference, rounding, runs, out)


def evidence(runs: dict[str, Scenario]) -> list[str]:
    """What each scenario's checks rest on: the supervisor's shrink and grow lines, the run's restart tags."""
    said = re.compile(r"mpi_train supervise: .*(going on without|ready: step|to grow:)")
    out = []
    for name, scenario in runs.items():
        start = scenario.lines[0][0] if scenario.lines else 0.0
        events = ", ".join(f"{event} at {at - start:.1f} s" for event, at in scenario.events.items())
        out.append(f"{name}: {events}")
        out += [f"{name}: {at - start:7.1f} s  {text}" for at, text in scenario.lines if said.search(text)]
        if scenario.run:
            out += [f"{name}: {tag} = {value}" for tag, value in sorted(scenario.run.restarts.items())]
    return out


def report(args, checks: list[Check], reference: dict, rounding: float | None, runs: dict[str, Scenario],
           out: Path) -> int:
    table = format_table(checks)
    step_s = reference["mean_times_after_warmup"]["step_time_s"]
    flags = f"--model vgg11 {args.train_flags}".strip()
    heading = (f"{flags} on synthetic data, 3 test hosts x 1 rank (1 thread each), batch "
               f"{args.batch_size}, {args.steps} steps "
               f"(c: {args.flap_steps}), a checkpoint every {args.checkpoint_every}, --timeout {args.timeout}, "
               f"--host-wait {args.host_wait:g}, --host-cooldown {args.cooldown:g}; reference {step_s:.3f} s a step "
               f"on 3 ranks, final loss {reference['final_loss']:.6f}"
               + (f" ({rounding:.2e} apart with --sync {args.rounding_sync})" if rounding is not None else ""))
    lines = "\n".join(evidence(runs))
    print(f"\n{heading}\n{table}\n\n{lines}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "grow-check.txt").write_text(f"{heading}\n{table}\n\n{lines}\n")
    print(f"grow_check: table in {out / 'grow-check.txt'}, each job's timed output in {out}/*/output.txt")
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
