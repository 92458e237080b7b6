"""A real two-host job: two test hosts (network namespaces, scripts/testhosts.sh), two ranks on each.

mpirun runs here and starts its daemons inside the hosts through scripts/netns-agent, as it
would over ssh; the tracking server listens on the hosts' bridge, the way a cluster's
server listens on an address its nodes reach. Needs root to create namespaces.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import MlflowServer, TestHosts, hosts_brought_up, mpirun, train, train_several

from mpi_train.models import build_model

pytestmark = pytest.mark.e2e

PREFIX, SUBNET = "mpitest", "10.78.0"  # apart from test hosts brought up by hand (testhost*, 10.77.0.*)
HOSTS = ("mpitest1", "mpitest2")
QUICK = ["--dataset", "synthetic", "--synthetic-size", "512", "--batch-size", "64", "--log-every", "2"]


@dataclass
class TwoHosts:
    hosts: TestHosts
    server: MlflowServer  # on the bridge: the hosts' side of mpirun's machine, like a cluster's tracking server

    @property
    def hostfile(self) -> Path:
        return self.hosts.hostfile

    def mpirun_options(self) -> dict:
        return self.hosts.mpirun_options()


@pytest.fixture(scope="module")
def testhosts(tmp_path_factory):
    """Two test hosts with 2 slots each and a tracking server they reach; always torn down, also when a test fails."""
    root = tmp_path_factory.mktemp("testhosts")
    with hosts_brought_up(root, PREFIX, SUBNET) as hosts:
        server = MlflowServer(root, host=f"{SUBNET}.1")  # starts while the first jobs run
        try:
            yield TwoHosts(hosts, server)
        finally:
            server.stop()


def test_the_hostfile_names_each_host_with_its_slots(testhosts):
    entries = [line for line in testhosts.hostfile.read_text().splitlines() if not line.startswith("#")]
    assert entries == [f"{SUBNET}.2 slots=2", f"{SUBNET}.3 slots=2"]


def test_a_lab_run_will_not_take_over_hosts_or_a_subnet_in_use(testhosts, tmp_path):
    """An experiment or soak given these hosts' prefix once took them over and removed them at its end; given their
    subnet, it made a second bridge on it and timed out unreached."""
    from mpi_train.errors import UserError
    from mpi_train.lab.network import NetworkPlan
    from mpi_train.lab.testhosts import TestHosts as LabHosts

    with pytest.raises(UserError, match=r"test hosts named mpitest\* exist already \(mpitest1, mpitest2\): another "):
        LabHosts(NetworkPlan((2,), (2,), ("1gbit",), prefix=PREFIX, subnet="10.79.0"), tmp_path).__enter__()
    with pytest.raises(UserError, match=rf"the subnet {SUBNET}\.0/24 is in use here \(mpitestbr has {SUBNET}\.1\)"):
        LabHosts(NetworkPlan((2,), (2,), ("1gbit",), prefix="other", subnet=SUBNET), tmp_path).__enter__()
    assert not list(tmp_path.iterdir())  # nothing made
    test_the_hostfile_names_each_host_with_its_slots(testhosts)  # and the hosts are still there


def test_collectives_are_correct_across_hosts(testhosts):
    result = mpirun(4, [], module="mpi_train collectives", timeout=120, **testhosts.mpirun_options())
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "all collectives correct" in result.stdout
    rendezvous = re.search(r"rendezvous (\S+):\d+", result.stdout).group(1)
    assert rendezvous == f"{SUBNET}.2"  # rank 0's address on the hosts' network, not loopback
    table = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\s+(\d)\s+(\S+)\s+ok", result.stdout, re.MULTILINE)}
    assert table == {0: HOSTS[0], 1: HOSTS[0], 2: HOSTS[1], 3: HOSTS[1]}


def test_training_across_hosts_is_tracked_per_host(testhosts, tmp_path):
    from mlflow import MlflowClient

    uri = testhosts.server.uri()
    summary = train(4, tmp_path, *QUICK, "--max-steps", "4", "--tracking-uri", uri, "--experiment", "testhosts",
                    "--system-metrics-every", "1", timeout=150, **testhosts.mpirun_options())
    assert summary["hosts"] == [HOSTS[0], HOSTS[0], HOSTS[1], HOSTS[1]]
    assert summary["rendezvous"].rsplit(":", 1)[0] == f"{SUBNET}.2"
    assert len(summary["steps"]) == 2 and summary["world_size"] == 4

    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.get_experiment_by_name("testhosts").experiment_id
    parent = client.search_runs([experiment_id], "tags.`mpi_train.role` = 'job'")[0]
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert parent.info.status == "FINISHED"
    assert parent.data.params["hosts"] == ",".join(HOSTS)
    local_ranks = {}
    for child in children:
        local_ranks.setdefault(child.data.tags["host"], []).append(int(child.data.tags["local_rank"]))
    assert {host: sorted(ranks) for host, ranks in local_ranks.items()} == {HOSTS[0]: [0, 1], HOSTS[1]: [0, 1]}
    for host in HOSTS:
        assert f"system/{host}/cpu_utilization_percentage" in parent.data.metrics, sorted(parent.data.metrics)
    environment = json.loads(Path(client.download_artifacts(parent.info.run_id, "environment.json",
                                                            str(tmp_path))).read_text())
    assert environment["launcher_env"].get("GLOO_SOCKET_IFNAME") == "eth0"  # the hosts' link, not lo


def test_every_sync_method_is_right_across_hosts_and_hierarchical_finds_them(testhosts):
    # The hand-computed-mean check of every method and compression, at 2 ranks on each of 2 hosts: here the
    # registered `hierarchical` takes its levels from MPI's host split (reduce in the host, allreduce between
    # the two leaders over the hosts' link, broadcast back), not from placement by hand.
    result = mpirun(4, [], module="tests.rank_programs.mpi_sync_check", timeout=240, **testhosts.mpirun_options())
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "hierarchical: MPI's host split found 2 host(s), leaders [0, 2]" in result.stdout
    for name in ("hierarchical", "hierarchical+fp16", "bucketed+bf16", "ring", "ddp_fp16"):
        assert f"{name}: mean gradient on every rank" in result.stdout
    for name in ("hierarchical+powersgd", "bucketed+powersgd"):
        assert f"{name}: one update and error feedback kept on every rank" in result.stdout
    assert "WRONG" not in result.stdout


def test_local_sgd_and_diloco_average_inside_each_host_and_across_the_hosts(testhosts, tmp_path):
    # Two levels: the ranks of each host average every 2 steps over their local link, whole; all four every 4,
    # compressed, the two host leaders alone crossing the hosts' link. Replicas (the last average, DiLoCo's outer
    # momentum) are checked at every step.
    levels = [*QUICK, "--max-steps", "8", "--period", "4", "--host-period", "2", "--eval-every", "4",
              "--check-every", "1", "--no-tracking"]
    runs = train_several(4, tmp_path, {"localsgd": [*levels, "--sync", "localsgd", "--compression", "fp16"],
                                       "diloco": [*levels, "--sync", "diloco", "--compression", "powersgd",
                                                  "--powersgd-start-step", "0"]},
                         timeout=240, **testhosts.mpirun_options())
    local = runs["localsgd"]
    assert local["hosts"] == [HOSTS[0], HOSTS[0], HOSTS[1], HOSTS[1]]
    # rank 0, a host leader, by step 8: its host's averages at steps 2 and 6 (S each way around a ring of 2) and
    # the hosts' at 4 and 8 (2(H-1)/H = 1 times S in float16 between 2 leaders): 2 S + 2 S/2
    model_bytes = sum(p.numel() * 4 for p in build_model("mnist_cnn").parameters())
    assert local["evaluations"][-1]["sent_mb"] == pytest.approx(3 * model_bytes / 1e6)
    assert local["evaluations"][0]["sent_mb"] == pytest.approx(1.5 * model_bytes / 1e6)  # step 4: one of each
    assert all(step["drift"] > 0 for step in local["steps"])  # an average (host or all) in every window of 2
    # DiLoCo's outer steps across the hosts carry PowerSGD's factors: fewer bytes than float16's whole change
    assert 2 * model_bytes / 1e6 < runs["diloco"]["evaluations"][-1]["sent_mb"] < 3 * model_bytes / 1e6


def test_the_bench_times_what_an_overlapped_method_cannot_hide_on_a_slow_link(testhosts, tmp_path):
    # At 50 Mbit/s the MNIST CNN's 4.8 MB of gradients take about a second to sum across the two hosts, far
    # longer than its backward: `bucketed`, which starts sending during backward, must pay nearly all of it,
    # as `allreduce` does after backward. (Gloo's barrier waits for collectives in flight, so a barrier between
    # backward and sync once hid that wait from the bench's timing.)
    testhosts.hosts.script("shape", "50mbit")
    try:
        out = tmp_path / "bench.json"
        result = mpirun(4, ["--model", "mnist_cnn", "--batch-size", "64", "--methods", "bucketed,allreduce",
                            "--steps", "3", "--warmup", "1", "--link-iters", "1", "--no-tracking", "--json", str(out)],
                        module="mpi_train bench", timeout=180, **testhosts.mpirun_options())
    finally:
        testhosts.hosts.script("unshape")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    rows = {row["method"]: row for row in json.loads(out.read_text())["methods"]}
    floor = 1.5 * rows["allreduce"]["wire_bytes"] / 6.25e6  # 2(N-1)/N·S per rank over 6.25 MB/s
    assert rows["allreduce"]["sync_s"] > 0.7 * floor, rows["allreduce"]
    assert rows["bucketed"]["exposed_s"] > 0.7 * floor, (rows["bucketed"], floor)
