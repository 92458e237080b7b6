"""What a network does to a job, made real on two test hosts: a link that goes down for good (the job ends naming
the host, the supervisor carries it on without it and grows it back when the link returns), rank 0's own link cut,
and a link that blinks.

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
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    LiveJob,
    MlflowServer,
    client_for,
    hosts_brought_up,
    job_runs,
    listening_on,
    losses,
    mpirun_launch,
    train,
    wait_for,
)

from mpi_train.lab import mpirun as launch

pytestmark = pytest.mark.e2e

PREFIX, SUBNET = "netfault", "10.88.0"
TIMEOUT_S = 15
STEPS = 12
BLINK_TIMEOUT_S = 40  # the blink test's: the outage plus TCP's longest retry in it, with room
GROW_STEPS = 50  # the grow test's: enough left after the shrink for growing to pay, after one lost probe too
GROW_TIMEOUT_S = 10  # the grow test's, whose steps take half a second
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
    """The job's losses with nothing going wrong, what a blink must reproduce bit for bit: the same 4 ranks on one
    host (the sums do not depend on where the ranks run), without the shaped links' second a step."""
    return losses(train(4, tmp_path_factory.mktemp("whole"), *JOB, "--no-tracking", timeout=180))


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
    replay = subprocess.run([sys.executable, "-m", "mpi_train", "replay", "--tracking-uri", uri, str(spool)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    client = client_for(uri)
    parent, _ = job_runs(client, "rank0cut", RUN_NAME)
    assert parent.info.status == "FAILED"
    logged = [m.step for m in client.get_metric_history(parent.info.run_id, "learning/loss")]
    assert logged == job.printed_steps() and len(logged) >= 5


def test_a_link_that_blinks_costs_a_stall_not_the_job(hosts, uninterrupted, tmp_path):
    uri = hosts.server.uri()
    # TCP retries a lost segment after 0.2, 0.6, 1.4, 3.0, 6.2 and 12.6 s: a 6 s outage can cost 12.6 s of silence,
    # which would outlast JOB's 15 s timeout once the collective's own wait before the cut is added
    job = FaultedJob(hosts, [*JOB, "--timeout", str(BLINK_TIMEOUT_S), "--tracking-uri", uri, "--experiment", "blink",
                          "--summary-json", str(tmp_path / "blink.json")], tmp_path)
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
    assert 4 <= stalls[0]["seconds"] <= 6 + 13 and 4 <= stalls[0]["step"] <= 6, stalls
    assert re.search(rf"network stall: host {hosts.host(2)} \(ranks 2, 3\) silent for [\d.]+ s from step \d+",
                     output), output

    client = client_for(uri)
    parent, _ = job_runs(client, "blink", RUN_NAME)
    assert parent.info.status == "FINISHED"
    assert hosts.host(2) in parent.data.tags["mpi_train.network_stalls"]
    history = client.get_metric_history(parent.info.run_id, "network/stall_s")
    assert [(m.step, round(m.value, 3)) for m in history] == [(stalls[0]["step"], round(stalls[0]["seconds"], 3))]


def test_a_host_gone_for_good_is_named_the_job_goes_on_without_it_and_grows_back_when_it_returns(hosts, tmp_path):
    """python -m mpi_train supervise --min-ranks 2: host 2's link is cut at step 3. The job ends within the timeout
    naming the host; host 2 does not answer the supervisor either, so the job is relaunched on host 1 alone with 2
    ranks and the same global batch. Then the link returns: host 2 answers for --host-cooldown, the job stops at a
    step boundary and goes on on 4 ranks again, and finishes in the same MLflow run, ranks 2 and 3 back in theirs.
    The links are not shaped here and rank 0 straggles 0.3 s a step instead: a step takes about half a second on
    either size, so the cut lands mid-training and the shrunk job still runs when host 2 is ready."""
    checkpoints, uri, steps = tmp_path / "checkpoints", hosts.server.uri(), GROW_STEPS
    placed = hosts.mpirun_options()
    # --synthetic-size 1088 replaces JOB's 1024: 17 steps an epoch, so three epochs hold GROW_STEPS
    line, env = mpirun_launch(4, [*JOB, "--synthetic-size", "1088", "--max-steps", str(steps), "--epochs", "3",
                                  "--timeout", str(GROW_TIMEOUT_S),
                                  "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "2", "--tracking-uri",
                                  uri, "--experiment", "gone", "--summary-json", str(tmp_path / "gone.json")],
                              hostfile=placed["hostfile"], env={**placed["env"], "MPI_TRAIN_SLOW": "0:0.3"})
    command = [sys.executable, "-m", "mpi_train", "supervise", "--max-restarts", "1", "--backoff", "0.5",
               "--host-wait", "3", "--min-ranks", "2", "--host-cooldown", "1", "--relaunch-cost", "2", "--", *line]
    lines: list[tuple[float, str]] = []  # each with when it came

    def said(pattern: str) -> re.Match | None:
        return re.search(pattern, "".join(text for _, text in lines))

    hosts.script("unshape")
    try:
        with launch.launched(command, env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) as supervisor:
            reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), text)
                                                                  for text in supervisor.stdout), daemon=True)
            reader.start()
            try:
                wait_for(lambda: said(rf"step\s+3/{steps}\b"), 120, "step 3")
                hosts.link(2, "down")
                cut = time.monotonic()
                wait_for(lambda: said("going on without them"), GROW_TIMEOUT_S + 60, "the shrink")
                hosts.link(2, "up")
                code = supervisor.wait(180)
            finally:
                hosts.link(2, "up")
            reader.join(10)
    finally:
        hosts.script("shape", "50mbit")
    output = "".join(text for _, text in lines)
    assert code == 0, output
    assert f"Unreachable: host {hosts.host(2)} (ranks 2, 3)" in output, output
    failed = next(at for at, text in lines if "attempt 1 failed" in text)
    print(f"link down at step 3: the attempt ended {failed - cut:.1f} s later")  # shown with pytest -s
    assert failed - cut <= GROW_TIMEOUT_S + 15, output
    first, second = f"{SUBNET}.2", f"{SUBNET}.3"  # the hosts as the hostfile names them
    assert (f"host(s) {second} did not answer for 3 s: going on without them on {first} with 2 ranks (was 4), the "
            f"global batch of 64 resharded") in output, output
    assert re.search(rf"Host\(s\) {second} returned ready: step [\d.]+ s on 2 ranks, about [\d.]+ s on 4; \d+ steps "
                     r"left save about \d+ s against a relaunch of 2 s \(stated: --relaunch-cost\): growing\.",
                     output), output
    grown_at = int(re.search(r"the job stopped at step (\d+) to grow: relaunching on "
                             rf"{first}, {second} with 4 ranks \(was 2\)", output).group(1))
    time.sleep(2)
    assert left_behind(str(checkpoints)) == []

    summary = json.loads((tmp_path / "gone.json").read_text())
    assert summary["world_size"] == 4 and summary["batch_size_per_rank"] == 16
    assert summary["resumed_from"] == {**summary["resumed_from"], "world_size": 2, "step": grown_at}
    assert summary["steps"][-1]["step"] == steps
    client = client_for(uri)
    parent, children = job_runs(client, "gone", RUN_NAME)  # one parent run for the three attempts
    assert parent.info.status == "FINISHED" and parent.data.tags["mpi_train.world_size"] == "4"
    assert "mpi_train.unreachable_hosts" not in parent.data.tags  # the failed attempt's end is in its cause now
    sizes = sorted((m.step, m.value) for m in client.get_metric_history(parent.info.run_id, "time/world_size"))
    shrunk_at = sizes[1][0]
    assert sizes == [(0, 4), (shrunk_at, 2), (grown_at, 4)] and 2 <= shrunk_at < grown_at
    assert parent.data.tags["mpi_train.restart.1"] == (
        f"attempt 1 ended FAILED (unreachable: host(s) {hosts.host(2)}, ranks 2,3); attempt 2 resumed from step "
        f"{shrunk_at} on 2 ranks (was 4)")
    assert parent.data.tags["mpi_train.restart.2"] == (
        f"attempt 2 ended KILLED (stopped by the supervisor at step {grown_at} to grow); attempt 3 resumed from step "
        f"{grown_at} on 4 ranks (was 2): host(s) {second} returned")
    logged = sorted(m.step for m in client.get_metric_history(parent.info.run_id, "learning/loss"))
    assert logged == list(range(1, steps + 1))  # each step once, across the three attempts
    # ranks 2 and 3 came back into the runs they had: four rank runs in all, every one finished
    by_rank = {c.data.tags["rank"]: c for c in children}
    assert sorted(by_rank) == ["0", "1", "2", "3"] and len(children) == 4
    assert all(c.info.status == "FINISHED" for c in children)
    assert "mpi_train.left" not in by_rank["3"].data.tags
    assert by_rank["3"].data.tags["mpi_train.rejoined"] == f"rejoined from step {grown_at} (attempt 3)"
