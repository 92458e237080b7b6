"""The job under torchrun: the same losses as under mpirun, a killed rank ends the job, MPI never initialised, and
an elastic job (--nnodes 1:2) grows when a second node joins.

Every job here is a real torchrun (python -m torch.distributed.run). A stand-in mpi4py whose
MPI module refuses to load sits first on the path of every torchrun job, so any attempt to
initialise MPI fails the job. The elastic job runs one torchrun agent on each of two test hosts
(scripts/testhosts.sh, as root), meeting at a c10d rendezvous on host 1's address.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import NETNS_AGENT, REPO, client_for, hosts_brought_up, job_runs, losses, train

from mpi_train.config.command_line import parse_config
from mpi_train.environments.torchrun import ELASTIC_AGENT, ELASTIC_LAUNCH_ENV, TorchrunEnvironment, elastic_split_error
from mpi_train.errors import UserError
from mpi_train.lab import mpirun as launch
from mpi_train.loop.job import resized_by_launcher

ENDS_WITHIN_S = 60
PREFIX, SUBNET = "tre", "10.91.0"
RENDEZVOUS_PORT = 29400  # inside host 1's namespace, where no other job listens
GROWN_STEPS, GROWN_STEP_S = 20, 0.4  # rank 0's steps slowed: the first attempt lasts 8 s or more


@pytest.fixture(autouse=True)
def agents_files_in_the_tests_folder(tmp_path, monkeypatch):
    """torchrun's agent keeps its workers' logs in $TMPDIR/torchelastic_* and leaves them there: each launch here
    inherits this test's own folder as its TMPDIR, removed with the test's files."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))


@pytest.fixture
def no_mpi(tmp_path) -> Path:
    """A folder that shadows mpi4py: importing mpi4py.MPI raises, so a job that initialises MPI fails."""
    package = tmp_path / "no_mpi" / "mpi4py"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "shadowed"\n')
    (package / "MPI.py").write_text('raise ImportError("MPI must not be initialised under torchrun or srun")\n')
    return package.parent


def torchrun(args: list[str], no_mpi: Path, *, nproc: int = 2, env: dict | None = None, timeout: float = 240):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "mpi_train", *args]
    return launch.run(command, env={**os.environ, "PYTHONPATH": f"{no_mpi}:{REPO}", "PYTHONUNBUFFERED": "1",
                                    **(env or {})},
                      timeout=timeout, cwd=REPO)


@pytest.mark.e2e
def test_torchrun_trains_one_job_with_the_losses_of_mpirun(tmp_path, quick_args, no_mpi):
    args = [*quick_args, "--max-steps", "6", "--sync", "allreduce"]
    summary = tmp_path / "torchrun.json"
    result = torchrun([*args, "--summary-json", str(summary)], no_mpi)
    assert result.returncode == 0, f"torchrun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    assert "2 rank(s) on 1 host(s)" in result.stdout  # one job of two ranks, not two jobs of one
    assert result.stdout.count("done in") == 1
    under_torchrun = json.loads(summary.read_text())
    under_mpirun = train(2, tmp_path, *args, name="mpirun")
    assert under_torchrun["world_size"] == 2
    assert len(losses(under_torchrun)) == len(losses(under_mpirun)) == 3
    assert losses(under_torchrun) == pytest.approx(losses(under_mpirun), rel=1e-6, abs=1e-7)


@pytest.mark.e2e
def test_a_killed_torchrun_rank_ends_the_job_and_keeps_the_record(mlflow_server, no_mpi):
    fault = "1:5:kill"
    started = time.time()
    result = torchrun(["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "2",
                       "--timeout", "10", "--tracking-uri", mlflow_server, "--experiment", "tests-torchrun",
                       "--run-name", "killed-rank"], no_mpi, env={"MPI_TRAIN_FAIL_AT": fault})
    ended = time.time()
    injected = re.search(r"injecting '\w+' on rank \d+ at \w+ \(unix time ([\d.]+)\)", result.stderr)
    assert injected, f"the fault was never injected:\n{result.stdout}\n{result.stderr}"
    assert result.returncode != 0
    assert ended - float(injected.group(1)) < ENDS_WITHIN_S, f"job took {ended - started:.0f} s in all"
    client = client_for(mlflow_server)
    deadline = time.monotonic() + 30
    while True:  # the guard process may record the end a moment after torchrun returns
        parent, children = job_runs(client, "tests-torchrun", "killed-rank")
        if parent.info.status != "RUNNING" and all(c.info.status != "RUNNING" for c in children):
            break
        assert time.monotonic() < deadline, "run left RUNNING"
        time.sleep(0.5)
    assert parent.info.status in ("FAILED", "KILLED")
    assert parent.data.params["world_size"] == "2"
    assert [m.step for m in client.get_metric_history(parent.info.run_id, "learning/loss")] == [2, 4]


@pytest.mark.e2e
def test_a_launcher_that_finds_fewer_ranks_than_torchrun_started_stops(no_mpi, quick_args):
    # --launcher mpi under torchrun: each process would be an MPI singleton, i.e. two one-rank jobs
    real_mpi = {"PYTHONPATH": str(REPO)}  # mpi4py must load here: it is the launcher asked for
    result = torchrun([*quick_args, "--max-steps", "2", "--launcher", "mpi"], no_mpi, env=real_mpi, timeout=120)
    assert result.returncode != 0
    text = " ".join(result.stderr.split())
    assert "WORLD_SIZE=2 says torchrun started 2 processes, but the mpi launcher found 1 rank(s)" in text
    assert "--launcher" in text
    # a clear error, not our traceback (torchrun prints its own)
    assert not re.search(r'File "[^"]*mpi_train/', result.stderr)
    assert "done in" not in result.stdout  # nobody trained


@pytest.mark.e2e
def test_torchrun_restarts_resume_from_the_checkpoint_into_the_same_run(mlflow_server, no_mpi, tmp_path):
    # 4 steps an epoch; checkpoints at steps 3 and 6; rank 1 killed at step 5 in the first attempt only. Local SGD
    # averaging every 2 steps: the checkpoint at step 3 holds each rank's own model, between two averages
    job = ["--dataset", "synthetic", "--synthetic-size", "256", "--batch-size", "64", "--epochs", "3", "--max-steps",
           "8", "--log-every", "1", "--checkpoint-every", "3", "--sync", "localsgd", "--period", "2"]
    fault = {"MPI_TRAIN_FAIL_AT": "1:5:kill", "MPI_TRAIN_FAIL_ONCE": str(tmp_path / "fault-happened")}
    summary = tmp_path / "restarted.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "1", "-m", "mpi_train", *job, "--checkpoint-dir", str(tmp_path / "ck"), "--resume",
               "auto", "--tracking-uri", mlflow_server, "--experiment", "tests-torchrun", "--run-name", "restarted",
               "--summary-json", str(summary)]
    result = launch.run(command, env={**os.environ, "PYTHONPATH": f"{no_mpi}:{REPO}", "PYTHONUNBUFFERED": "1",
                                      **fault}, timeout=240, cwd=REPO)
    assert result.returncode == 0, f"torchrun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    assert result.stderr.count("injecting 'kill'") == 1
    restarted = json.loads(summary.read_text())
    whole = train(2, tmp_path, *job, "--checkpoint-dir", str(tmp_path / "ck-whole"), "--no-tracking", name="whole")
    assert restarted["resumed_from"]["step"] == 3
    assert restarted["weights_sha256"] == whole["weights_sha256"]
    client = client_for(mlflow_server)
    parent, _ = job_runs(client, "tests-torchrun", "restarted")
    assert parent.info.status == "FINISHED" and parent.data.tags["mpi_train.attempts"] == "2"
    history = client.get_metric_history(parent.info.run_id, "learning/loss")
    assert sorted(m.step for m in history) == list(range(1, 9))


def torchrun_variables(**changed: str) -> dict:
    """What torchrun's agent gives a worker of a job on 2 nodes x 1 process, with `changed` over it."""
    return {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "2",
            "MASTER_ADDR": "node1", "MASTER_PORT": "29500", ELASTIC_AGENT: "grow",
            "TORCHELASTIC_RESTART_COUNT": "0", **changed}


def test_torchruns_agent_may_resize_the_job_and_a_batch_it_cannot_split_is_refused_in_its_terms():
    assert TorchrunEnvironment(torchrun_variables()).resizes_on_restart
    without_agent = torchrun_variables()
    del without_agent[ELASTIC_AGENT]
    assert not TorchrunEnvironment(without_agent).resizes_on_restart
    assert TorchrunEnvironment(torchrun_variables()).resized_split_error(64, 1) is None
    refused = TorchrunEnvironment(torchrun_variables(WORLD_SIZE="3", GROUP_WORLD_SIZE="3")).resized_split_error(64, 1)
    assert refused == elastic_split_error(64, 1, nodes=3, per_node=1)
    assert "3 node(s) x 1 process(es) (WORLD_SIZE=3)" in refused and "--batch-size 64" in refused
    assert "the node counts nearest 3 that split it are 2 and 4" in refused
    # 2 processes a node, 2 micro-batches each: 40 splits into 2 nodes' 8 shares or 5 nodes' 20, not 3 nodes' 12
    assert "nearest 3 that split it are 2 and 5" in elastic_split_error(40, 2, nodes=3, per_node=2)
    assert "in 2 micro-batches each" in elastic_split_error(40, 2, nodes=3, per_node=2)
    assert "no node count splits it with 4 process(es)" in elastic_split_error(6, 1, nodes=1, per_node=4)


def test_under_torchruns_agent_resume_auto_reshards_with_no_flag_and_refuses_a_batch_it_cannot_split(tmp_path):
    def resized(world: int, *flags: str):
        config = parse_config(["--batch-size", "64", "--checkpoint-dir", str(tmp_path), *flags])
        environment = TorchrunEnvironment(torchrun_variables(WORLD_SIZE=str(world), GROUP_WORLD_SIZE=str(world)))
        return resized_by_launcher(config, environment)

    assert resized(2, "--resume", "auto").reshard
    assert not resized(2).reshard  # a job that resumes nothing, or names its checkpoint, is left as given
    with pytest.raises(UserError) as refused:
        resized(3, "--resume", "auto")
    assert str(refused.value) == elastic_split_error(64, 1, nodes=3, per_node=1)
    assert not resized(3).reshard  # the job's own check says it for a job that resumes nothing (validation.py)


def test_an_attempt_on_the_agents_store_keeps_its_keys_apart_and_one_on_its_own_store_agrees_across_nodes():
    shared = {"TORCHELASTIC_USE_AGENT_STORE": "True"}
    after_failure = TorchrunEnvironment(torchrun_variables(**shared, TORCHELASTIC_RESTART_COUNT="1"))
    grown = TorchrunEnvironment(torchrun_variables(**shared, WORLD_SIZE="4", GROUP_WORLD_SIZE="4"))
    prefixes = {TorchrunEnvironment(torchrun_variables(**shared)).attempt_prefix(), after_failure.attempt_prefix(),
                grown.attempt_prefix()}
    assert len(prefixes) == 3
    # a node that joined after node 1's restart counts no restart: on a store of the attempt's own, the ranks agree
    own = {"TORCHELASTIC_USE_AGENT_STORE": "False"}
    assert (TorchrunEnvironment(torchrun_variables(**own, TORCHELASTIC_RESTART_COUNT="1")).attempt_prefix()
            == TorchrunEnvironment(torchrun_variables(**own, RANK="1")).attempt_prefix())


def processes() -> list[str]:
    """Every process on this machine (the test hosts share its process table), as `ps` lists its command line."""
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=False).stdout.splitlines()


class Agent:
    """One torchrun agent of an elastic job (--nnodes 1:2) on a test host; its output read, line by line with the
    time each arrived, while it runs."""

    def __init__(self, hosts, number: int, args: list[str], env: dict):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1",
                    "--max-restarts", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    f"{SUBNET}.2:{RENDEZVOUS_PORT}", "--rdzv-id", "grow", "--rdzv-conf", "last_call_timeout=1",
                    "-m", "mpi_train", *args]
        # netns-agent runs it inside host `number`'s namespace, named as that host, as mpirun's ssh would
        self.started = time.monotonic()
        self.process = launch.start([str(NETNS_AGENT), hosts.host(number), shlex.join(torchrun)], env, cwd=REPO,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line))

    @property
    def output(self) -> str:
        return "".join(line for _, line in self.lines)

    def first(self, pattern: str, after: float = 0.0) -> float | None:
        """When the first line matching `pattern` arrived after `after`, or None."""
        return next((at for at, line in self.lines if at >= after and re.search(pattern, line)), None)

    def exit_status(self, timeout_s: float) -> int:
        """Its exit status once it has ended and its output is read to the end (the caller stops it either way)."""
        code = self.process.wait(timeout_s)
        self.reader.join(10)
        return code


@pytest.mark.e2e
def test_an_elastic_torchrun_job_grows_to_the_node_that_joins_in_one_run_and_trains_no_step_twice(tmp_path, no_mpi):
    """Node 1's agent starts the job alone, rank 0 slowed to leave node 2's agent time to join mid-job: torchrun's
    agents stop the worker with SIGTERM, which the job takes at its next step boundary, checkpointing there (its only
    checkpoint before the end); they meet again and start both at WORLD_SIZE 2, and the job resumes from that very
    step, resharded with no flag added, into the same MLflow run."""
    summary, uri = tmp_path / "grown.json", f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = ["--dataset", "synthetic", "--synthetic-size", "1280", "--batch-size", "64", "--log-every", "1",
           "--max-steps", str(GROWN_STEPS), "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "100",
           "--resume", "auto", "--timeout", "60", "--tracking-uri", uri, "--experiment", "tests-torchrun",
           "--run-name", "grown", "--summary-json", str(summary)]
    env = {**os.environ, "PYTHONPATH": f"{no_mpi}:{REPO}", "PYTHONUNBUFFERED": "1", **ELASTIC_LAUNCH_ENV,
           "MPI_TRAIN_SLOW": f"0:{GROWN_STEP_S}"}
    with hosts_brought_up(tmp_path, PREFIX, SUBNET, count=2, slots=1) as hosts:
        first = Agent(hosts, 1, job, env)
        second = None
        try:
            deadline = time.monotonic() + 120
            while not first.first(rf"step\s+1/{GROWN_STEPS}\b"):
                assert first.process.poll() is None and time.monotonic() < deadline, first.output
                time.sleep(0.05)
            second = Agent(hosts, 2, job, env)
            codes = [first.exit_status(120), second.exit_status(60)]
        finally:
            for agent in (first, second):
                if agent is not None:
                    launch.stop(agent.process)
    output = first.output + second.output
    assert codes == [0, 0], output
    assert not [line for line in processes() if str(summary) in line]  # every attempt's workers ended

    def printed(pattern: str, after: float) -> float | None:  # rank 0 prints, on whichever node it is
        return min(filter(None, (agent.first(pattern, after) for agent in (first, second))), default=None)

    stop = re.search(r"SIGTERM from torchrun's agent received \(a node joined or left, or torchrun is stopping\): "
                     r"checkpointed at step (\d+) and stopped", output)
    assert stop, output
    stopped = int(stop.group(1))
    assert 1 <= stopped < GROWN_STEPS
    # each step trained once: printed once, by one attempt or the other
    steps = sorted(int(found) for found in re.findall(rf"step\s+(\d+)/{GROWN_STEPS}\b", output))
    assert steps == list(range(1, GROWN_STEPS + 1)), output
    grown_at = printed(r"2 rank\(s\) on 2 host\(s\)", after=second.started)
    assert grown_at is not None, output
    stepped_at = printed(rf"step\s+{stopped + 1}/{GROWN_STEPS}\b", after=grown_at)
    print(f"node 2's agent started; the job stopped at step {stopped}, and its next step at world size 2 came "
          f"{stepped_at - second.started:.1f} s after the agent started")
    grown = json.loads(summary.read_text())
    assert grown["world_size"] == 2
    assert grown["resumed_from"]["world_size"] == 1 and grown["resumed_from"]["step"] == stopped
    client = client_for(uri)
    parent, children = job_runs(client, "tests-torchrun", "grown")
    assert parent.info.status == "FINISHED" and parent.data.tags["mpi_train.attempts"] == "2"
    assert f"resumed from step {stopped} on 2 ranks (was 1)" in parent.data.tags["mpi_train.restart.1"]
    assert [child.data.tags["rank"] for child in children] == ["0", "1"]
    history = client.get_metric_history(parent.info.run_id, "learning/loss")
    assert sorted(m.step for m in history) == list(range(1, GROWN_STEPS + 1))
