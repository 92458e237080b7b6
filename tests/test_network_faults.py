"""What a network does to a job, made real on two test hosts: a link that goes down for good, and one that blinks.

Each host's link is a veth cable to a bridge here; `ip link set ... down` on the bridge's end
cuts the host off as a pulled cable would (no reset reaches either side). The links are
shaped to 50 Mbit/s so that a step takes about a second and the cut lands mid-training.
Needs root, like every test-host test.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LiveJob, MlflowServer, client_for, hosts_brought_up, job_runs, listening_on, losses, train

pytestmark = pytest.mark.e2e

PREFIX, SUBNET = "netfault", "10.88.0"
TIMEOUT_S = 15
STEPS = 12
RUN_NAME = "allreduce-np4-seed42"  # the job's default run name
JOB = ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--log-every", "1",
       "--max-steps", str(STEPS), "--timeout", str(TIMEOUT_S), "--sync", "allreduce"]


class FaultedJob(LiveJob):
    """A job on the test hosts whose link a test takes down at a step."""

    def __init__(self, hosts, args: list[str], cwd: Path):
        super().__init__(4, args, cwd, STEPS, **hosts.mpirun_options())

    def cut_link_at_step(self, hosts, number: int, step: int) -> tuple[int, float]:
        """Take test host `number`'s link down at `step` for good: the job's exit status, and seconds from the cut
        to its end. The link comes back afterwards, whatever happened."""
        try:
            self.wait_for_step(step)
            hosts.link(number, "down")
            cut = time.monotonic()
            code = self.wait(TIMEOUT_S + 60)
            return code, time.monotonic() - cut
        finally:
            hosts.link(number, "up")

    def printed_steps(self) -> list[int]:
        return [int(s) for s in re.findall(rf"step\s+(\d+)/{STEPS}\b", self.output)]


def left_behind(marker: str) -> list[str]:
    """Processes of a job still alive anywhere on this machine (every test host shares its process table)."""
    table = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=False).stdout.splitlines()
    return [line for line in table if marker in line or re.search(r"\bprted\b", line)]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    root = tmp_path_factory.mktemp("netfault")
    with hosts_brought_up(root, PREFIX, SUBNET) as made:
        made.script("shape", "50mbit")
        made.server = MlflowServer(root, host=f"{SUBNET}.1")
        try:
            yield made
        finally:
            made.server.stop()


@pytest.fixture(scope="module")
def uninterrupted(hosts, tmp_path_factory):
    """The job's losses with nothing going wrong: what a blink and a resume must reproduce bit for bit."""
    return losses(train(4, tmp_path_factory.mktemp("whole"), *JOB, "--no-tracking", timeout=180,
                        **hosts.mpirun_options()))


def test_a_host_that_loses_its_link_ends_the_job_named_and_resume_continues_exactly(hosts, uninterrupted, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    uri = hosts.server.uri()
    job = FaultedJob(hosts, [*JOB, "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "2", "--tracking-uri",
                             uri, "--experiment", "linkdown", "--summary-json", str(tmp_path / "cut.json")], tmp_path)
    code, ended = job.cut_link_at_step(hosts, 2, step=5)
    output = job.output
    print(f"link down at step 5: the job ended {ended:.1f} s later with exit status {code}")  # shown with pytest -s
    assert code != 0, output
    assert ended <= TIMEOUT_S + 15, f"the job took {ended:.0f} s to end after the link went down:\n{output}"
    assert f"Unreachable: host {hosts.host(2)} (ranks 2, 3)" in output, output
    time.sleep(2)
    assert left_behind(str(checkpoints)) == []

    client = client_for(uri)
    parent, _ = job_runs(client, "linkdown", RUN_NAME)
    assert parent.info.status == "FAILED"
    assert parent.data.tags["mpi_train.unreachable_hosts"] == hosts.host(2)
    assert parent.data.tags["mpi_train.unreachable_ranks"] == "2,3"
    logged = [m.step for m in client.get_metric_history(parent.info.run_id, "learning/loss")]
    assert logged == job.printed_steps() and len(logged) >= 5  # every step logged before the cut is kept

    resumed = train(4, tmp_path, *JOB, "--no-tracking", "--resume", str(checkpoints), name="resumed", timeout=180,
                    **hosts.mpirun_options())
    first = resumed["steps"][0]["step"]
    assert first > 1
    assert losses(resumed) == uninterrupted[first - 1:]


def test_when_rank_0s_own_host_loses_its_link_every_side_still_ends(hosts, tmp_path):
    """Rank 0 cannot tell its own cut from every other host's; nor can mpirun reach rank 0's daemon or the others'
    ranks reach rank 0. Both sides end, mpirun exits non-zero, and what rank 0 could not send is replayed after."""
    uri = hosts.server.uri()
    job = FaultedJob(hosts, [*JOB, "--tracking-uri", uri, "--experiment", "rank0cut", "--summary-json",
                          str(tmp_path / "cut.json")],
                  tmp_path)
    code, ended = job.cut_link_at_step(hosts, 1, step=5)
    output = job.output
    print(f"rank 0's link down at step 5: the job ended {ended:.1f} s later with exit status {code}")  # pytest -s
    assert code != 0, output
    assert ended <= TIMEOUT_S + 15, f"the job took {ended:.0f} s to end after rank 0's link went down:\n{output}"
    assert f"Rank 0 (on {hosts.host(1)}) has not answered this rank's heartbeat" in " ".join(output.split()), output
    time.sleep(2)
    assert left_behind(str(tmp_path / "cut.json")) == []

    spool = tmp_path / "mlruns" / "spool"  # rank 0 could not reach the server: its end waits in the spool
    replay = subprocess.run([sys.executable, "-m", "mpi_train.replay", "--tracking-uri", uri, str(spool)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    client = client_for(uri)
    parent, _ = job_runs(client, "rank0cut", RUN_NAME)
    assert parent.info.status == "FAILED"
    logged = [m.step for m in client.get_metric_history(parent.info.run_id, "learning/loss")]
    assert logged == job.printed_steps() and len(logged) >= 5


def test_a_link_that_blinks_costs_a_stall_not_the_job(hosts, uninterrupted, tmp_path):
    uri = hosts.server.uri()
    job = FaultedJob(hosts, [*JOB, "--tracking-uri", uri, "--experiment", "blink", "--summary-json",
                          str(tmp_path / "blink.json")], tmp_path)
    job.wait_for_step(4)
    address, port = re.search(r"rendezvous ([\d.]+):(\d+)", job.output).groups()
    # the rendezvous store listens where the other host reaches rank 0, nowhere else
    assert address == f"{SUBNET}.2" and listening_on(int(port), hosts.host(1)) == {address}
    hosts.link(2, "down")
    time.sleep(6)
    hosts.link(2, "up")
    code = job.wait(180)
    output = job.output
    assert code == 0, output
    summary = json.loads((tmp_path / "blink.json").read_text())
    assert losses(summary) == uninterrupted
    stalls = summary["network_stalls"]
    assert len(stalls) == 1 and stalls[0]["host"] == hosts.host(2) and stalls[0]["ranks"] == [2, 3], stalls
    assert 4 <= stalls[0]["seconds"] <= 12 and 4 <= stalls[0]["step"] <= 6, stalls
    assert re.search(rf"network stall: host {hosts.host(2)} \(ranks 2, 3\) silent for [\d.]+ s from step \d+",
                     output), output

    client = client_for(uri)
    parent, _ = job_runs(client, "blink", RUN_NAME)
    assert parent.info.status == "FINISHED"
    assert hosts.host(2) in parent.data.tags["mpi_train.network_stalls"]
    history = client.get_metric_history(parent.info.run_id, "network/stall_s")
    assert [(m.step, round(m.value, 3)) for m in history] == [(stalls[0]["step"], round(stalls[0]["seconds"], 3))]
