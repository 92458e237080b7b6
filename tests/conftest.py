"""Shared test helpers: launching real mpirun jobs of this package."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch.distributed as dist

from mpi_train.lab import mpirun as launch

REPO = Path(__file__).resolve().parents[1]

# Open MPI's libfabric transport (btl ofi) waits about 1 s in every rank's MPI_Init on a machine without a fabric for
# it, as this one and CI's are (docs/clusters.md): left out of every process the tests start. MPI carries only the
# jobs' start-up and control messages, which shared memory and TCP serve.
os.environ.setdefault("OMPI_MCA_btl", "^ofi")

MPI_ENV = {**launch.OPEN_MPI_ENV, "PYTHONUNBUFFERED": "1"}


def mpirun_launch(np: int, args: list[str], *, module: str = "mpi_train", env: dict | None = None,
                  hostfile: Path | None = None, rank_prefix: tuple[str, ...] = ()) -> tuple[list[str], dict]:
    """The command line and environment of `python -m module args` under a real `mpirun -np N` (module may
    end in a subcommand: "mpi_train bench").

    Without a hostfile every rank runs here (oversubscribed); with one, its slots place the ranks
    (--oversubscribe would let mpirun put them all on the first host). `rank_prefix` is a command
    each rank's python runs under.
    """
    placement = ["--hostfile", str(hostfile)] if hostfile else ["--oversubscribe"]
    command = ["mpirun", "-np", str(np), *placement, *rank_prefix, sys.executable, "-m", *module.split(), *args]
    return command, {**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO), **(env or {})}


def mpirun(np: int, args: list[str], *, module: str = "mpi_train", timeout: float = 240,
           env: dict | None = None, cwd: Path | None = None, hostfile: Path | None = None,
           rank_prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run `python -m module args` under a real `mpirun -np N` (see mpirun_launch) and return the finished process."""
    command, launch_env = mpirun_launch(np, args, module=module, env=env, hostfile=hostfile, rank_prefix=rank_prefix)
    return launch.run(command, env=launch_env, timeout=timeout, cwd=cwd or REPO)


def train(np: int, tmp_path: Path, *args: str, name: str = "summary", **kwargs) -> dict:
    """A real training job; returns its summary JSON (asserting the job succeeded)."""
    summary = tmp_path / f"{name}.json"
    result = mpirun(np, [*args, "--summary-json", str(summary)], **kwargs)
    assert result.returncode == 0, f"mpirun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return json.loads(summary.read_text())


def train_several(np: int, tmp_path: Path, jobs: dict[str, list[str]], **kwargs) -> dict[str, dict]:
    """Several real training jobs one after another in the same mpirun (tests/rank_programs/jobs_run.py); each one's
    summary."""
    plan = tmp_path / "jobs.json"
    plan.write_text(json.dumps(jobs))
    result = mpirun(np, [str(tmp_path), str(plan)], module="tests.rank_programs.jobs_run", **kwargs)
    assert result.returncode == 0, f"mpirun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in jobs}


def losses(summary: dict) -> list[float]:
    return [step["loss"] for step in summary["steps"]]


class LiveJob:
    """An mpirun job whose output is read while it runs, so a test can act at a given step."""

    def __init__(self, np: int, args: list[str], cwd: Path, steps: int, **options):
        command, env = mpirun_launch(np, args, **options)
        self.steps = steps
        self.cleanup = ExitStack()  # the launch's own TMPDIR, removed once it has ended (see lab/mpirun.py)
        env.update(self.cleanup.enter_context(launch.own_tmpdir()))
        self.process = launch.start(command, env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_step(self, step: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not re.search(rf"step\s+{step}/{self.steps}\b", self.output):
            assert self.process.poll() is None, f"the job ended before step {step}:\n{self.output}"
            assert time.monotonic() < deadline, f"no step {step} after {timeout_s} s:\n{self.output}"
            time.sleep(0.05)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout_s)
        finally:
            launch.stop(self.process)
            self.reader.join(10)
            self.cleanup.close()


def listening_on(port: int, namespace: str | None = None) -> set[str]:
    """The local addresses a TCP port listens on (in a test host's network namespace, if named)."""
    command = ["ss", "-ltnH", f"sport = :{port}"]
    if namespace:
        command = ["ip", "netns", "exec", namespace, *command]
    listing = subprocess.run(command, capture_output=True, text=True, check=False).stdout
    return {line.split()[3].rsplit(":", 1)[0].strip("[]") for line in listing.splitlines() if line.strip()}


@contextmanager
def tmpfs(disk: Path, size: str):
    """A real tmpfs of `size` at the new folder `disk`, a disk that fills up (mounting one needs root); unmounted
    lazily, as a file left open (MLflow's cached store engine) would keep it busy."""
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True,
                             check=False)
    if mounted.returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    """A real 64 KiB tmpfs."""
    with tmpfs(tmp_path / "disk", "64k") as disk:
        yield disk


def filled(disk):
    """`disk` with no byte left: a file grown until the system refuses."""
    with open(disk / "filler", "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            pass
    return disk


@pytest.fixture
def quick_args() -> list[str]:
    """A run of a few seconds: small synthetic MNIST-shaped data, not recorded in MLflow."""
    return ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "2",
            "--no-tracking"]


# --- Experiment tracking: a real MLflow server and tracked jobs, shared by the whole session. ---

def client_for(uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def job_runs(client, experiment: str, run_name: str):
    """The newest parent run called `run_name` in `experiment`, and its children ordered by rank."""
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    parents = client.search_runs([experiment_id],
                                 f"tags.`mpi_train.role` = 'job' and attributes.run_name = '{run_name}'",
                                 order_by=["attributes.start_time DESC"])
    parent = parents[0]
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    return parent, sorted(children, key=lambda c: int(c.data.tags["rank"]))


def artifact_texts(client, run_id: str, folder: Path) -> list[str]:
    """Every artifact of a run that reads as text, downloaded into `folder`."""
    texts = []
    for path in Path(client.download_artifacts(run_id, "", str(folder))).rglob("*"):
        if path.is_file():
            try:
                texts.append(path.read_text())
            except UnicodeDecodeError:  # a picture or the weights
                continue
    return texts


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout_s: float, what: str, every_s: float = 0.2):
    """Poll `condition` until it returns something true, and return that; fail naming `what` after `timeout_s`.

    A condition that should stop the wait early (a process that died) asserts inside itself.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(every_s)


class MlflowServer:
    """`python -m mpi_train server` on a free port of `host`, its store under `root`, started at once; `uri()`
    waits until it answers (~15 s). It can be stopped and started again as the same server (same port, same
    store), as an outage test needs.
    """

    def __init__(self, root: Path, host: str = "127.0.0.1", credentials: dict | None = None):
        self.root, self.host, self.port, self.process = root, host, free_port(host), None
        self.credentials = credentials  # MLFLOW_TRACKING_USERNAME/PASSWORD: run it with --auth, that user its admin
        self.url = f"http://{host}:{self.port}"
        self.log = root / "server.log"
        self.launch()

    def launch(self) -> None:
        """Start the server command; `wait_up` waits until it answers."""
        from mpi_train.tracking.store import DEFAULT_STORE_DIR

        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mpi_train", "server", "--host", self.host, "--port", str(self.port),
                 "--workers", "1", "--root", str(self.root / DEFAULT_STORE_DIR), *self.security()],
                cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPO), **(self.credentials or {}),
                     "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # one process less

    def security(self) -> list[str]:
        """--auth with credentials; beyond loopback without them --insecure: the test hosts' bridge exists on this
        machine alone."""
        if self.credentials:
            return ["--auth"]
        return [] if self.host.startswith("127.") else ["--insecure"]

    def answers(self) -> bool:
        from mpi_train.tracking.probe import server_answers

        return server_answers(self.url)

    def uri(self) -> str:
        """The server's URI, once it answers."""
        def up() -> bool:
            assert self.process.poll() is None, f"the mlflow server exited:\n{self.log.read_text()[-2000:]}"
            return self.answers()

        wait_for(up, 150, f"the mlflow server at {self.url} (log: {self.log})")
        return self.url

    def restart(self) -> str:
        """The same server again, after `stop`."""
        self.launch()
        return self.uri()

    def stop(self, sent: signal.Signals = signal.SIGTERM) -> None:
        """What Ctrl-C, `kill` or a closed terminal (SIGHUP) does: the command stops mlflow and its workers; SIGKILL if
        it lingers. Sent SIGKILL, the command leaves it to its reaper, which stops them within a few seconds."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(sent)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        wait_for(lambda: not self.answers(), 30, f"the mlflow server at {self.url} to stop")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A tracking server on loopback, shared by the whole session."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    try:
        yield server.uri()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tracked_jobs(mlflow_server, tmp_path_factory):
    """Two finished np 2 jobs (allreduce with --save-model, gather_scatter evaluated every 4 steps) in the experiment
    `tests-compare`, and `rerun`: the allreduce job again from the config.toml its run logged, filed under
    `tests-rerun` (in gather_scatter's mpirun)."""
    tmp = tmp_path_factory.mktemp("tracked")
    args = ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "2",
            "--max-steps", "8", "--experiment", "tests-compare"]
    host_port = mlflow_server.removeprefix("http://")
    # a password in the URI and a token in the environment: neither may reach the run
    allreduce = train(2, tmp, *args, "--sync", "allreduce", "--save-model", "--tracking-uri",
                      f"http://alice:s3cret-pw@{host_port}", name="allreduce",
                      env={"MLFLOW_TRACKING_TOKEN": "s3cret-token", "MLFLOW_TRACKING_URI": ""})
    client = client_for(mlflow_server)
    run_id = job_runs(client, "tests-compare", "allreduce-np2-seed42")[0].info.run_id
    job_file = client.download_artifacts(run_id, "config.toml", str(tmp))
    return {"allreduce": allreduce, **train_several(2, tmp, {
        "gather_scatter": [*args, "--sync", "gather_scatter", "--eval-every", "4"],
        "rerun": ["--config", job_file, "--experiment", "tests-rerun"],
    }, env={"MLFLOW_TRACKING_URI": mlflow_server})}


TESTHOSTS_SCRIPT = REPO / "scripts" / "testhosts.sh"
NETNS_AGENT = REPO / "scripts" / "netns-agent"


def why_no_namespaces(prefix: str) -> str | None:
    """The reason test hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "test hosts need root: they create network namespaces (CI runs as root)"
    if shutil.which("ip") is None:
        return "network namespaces cannot be created: the ip command (iproute2) is missing"
    probe = f"{prefix}probe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode:
        return f"network namespaces cannot be created here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


@dataclass
class TestHosts:
    """Test hosts of scripts/testhosts.sh, each a network namespace with a link to a bridge here."""

    __test__ = False  # not a test class, whatever its name
    prefix: str
    subnet: str
    hostfile: Path
    slots: int = 2

    def script(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "TESTHOSTS_PREFIX": self.prefix, "TESTHOSTS_SUBNET": self.subnet,
               "TESTHOSTS_HOSTFILE": str(self.hostfile), "TESTHOSTS_SLOTS": str(self.slots)}
        done = subprocess.run([str(TESTHOSTS_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, f"testhosts.sh {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def host(self, number: int) -> str:
        return f"{self.prefix}{number}"

    def link(self, number: int, state: str) -> None:
        """Take host `number`'s link down or bring it up (the bridge's end of its cable)."""
        subprocess.run(["ip", "link", "set", f"{self.prefix}{number}v", state], check=True, timeout=10)

    def mpirun_options(self) -> dict:
        """What places a job on the test hosts, as a cluster's hostfile and ssh would."""
        return {"hostfile": self.hostfile, "env": {"PRTE_MCA_plm_ssh_agent": str(NETNS_AGENT)}}


@contextmanager
def hosts_brought_up(root: Path, prefix: str, subnet: str, count: int = 2, slots: int = 2):
    """`count` test hosts with `slots` slots each, always torn down (and checked gone), also when a test fails."""
    reason = why_no_namespaces(prefix)
    if reason:
        pytest.skip(reason)
    hosts = TestHosts(prefix, subnet, root / "hostfile", slots)
    try:
        hosts.script("up", str(count))
        yield hosts
    finally:
        hosts.script("down")
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        left = [line for line in listing.splitlines() if line.startswith(prefix)]
        assert not left, f"test hosts left behind: {left}"


@pytest.fixture
def one_rank_group():
    """A real Gloo process group of one rank, in this process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class PlainQueue:
    """A queue whose items travel as bytes. A tensor put on a torch-registered queue travels as a handle to shared
    memory that the parent fetches from the sender, and a rank that has exited by then resets that connection."""

    def __init__(self, queue):
        self.queue = queue

    def put(self, item) -> None:
        self.queue.put(pickle.dumps(item))


def forked_ranks(target, world: int, store: str, *args) -> dict:
    """`target(rank, store, queue, *args)` on `world` ranks, each a process forked from this one (the ranks inherit
    torch, imported already): rank -> what it put on the queue, a rank's traceback failing the test."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    ranks = [context.Process(target=target, args=(rank, store, PlainQueue(queue), *args)) for rank in range(world)]
    for process in ranks:
        process.start()
    got = dict(pickle.loads(queue.get(timeout=120)) for _ in ranks)
    for process in ranks:
        process.join(timeout=30)
    for rank, result in got.items():
        assert not isinstance(result, str), f"rank {rank} failed:\n{result}"
    return got
