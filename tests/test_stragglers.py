"""A straggler host: one link at a tenth of the others' rate, found, named, priced by the model and reported.

The end-to-end test needs root (three test hosts with tc-shaped links, one rank each); the
rest are the pieces: which pairs are timed, which host is named, and what the model charges.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO, client_for, hosts_brought_up, job_runs, mpirun

from mpi_train import stragglers
from mpi_train.netmodel import FAMILIES, Layout, Link, Network

PREFIX, SUBNET = "straggle", "10.86.0"  # apart from every other user of scripts/testhosts.sh
MB = 1e6


def test_the_hosts_are_timed_around_a_ring_of_their_first_ranks():
    hosts = ["a", "a", "b", "b", "c", "c"]
    assert stragglers.leaders(hosts) == [0, 2, 4]
    assert stragglers.host_pairs(hosts) == [(0, 2), (2, 4), (4, 0)]
    assert stragglers.host_pairs(["a", "b"]) == [(0, 1)]  # two hosts: one pair, not the same one twice
    assert stragglers.host_pairs(["a", "a"]) == []


def test_the_host_whose_pairs_are_both_slow_is_named():
    hosts = ["a", "b", "c"]
    pairs = stragglers.host_pairs(hosts)  # (a,b) (b,c) (c,a)
    per_host = stragglers.host_bandwidths(hosts, pairs, [120 * MB, 12 * MB, 12.5 * MB])
    assert per_host == {"a": 120 * MB, "b": 120 * MB, "c": 12.5 * MB}
    found = stragglers.find(hosts, per_host)
    assert found is not None and found.host == "c" and found.ranks == (2,)
    assert "host c (rank 2)" in found.describe() and "12.5 MB/s against 120.0 MB/s" in found.describe()
    even = stragglers.host_bandwidths(hosts, pairs, [120 * MB, 100 * MB, 110 * MB])
    assert stragglers.find(hosts, even) is None  # within a factor of 2: nobody is named
    two = stragglers.host_bandwidths(["a", "b"], [(0, 1)], [12 * MB])
    assert stragglers.find(["a", "b"], two) is None  # one pair cannot say which end is slow


def test_the_model_charges_a_straggler_where_its_traffic_goes():
    fast, slow = Link(100e-6, 1 / (125 * MB)), Link(100e-6, 1 / (12.5 * MB))
    even, straggling = Network(fast, fast), Network(fast, fast, slow)
    three = Layout(3, 1)
    size = 4.8 * MB
    ring, root = FAMILIES["ring_allreduce"].time, FAMILIES["root"].time
    # a ring waits for its slowest edge at every step
    assert ring(size, three, straggling) == pytest.approx(ring(size, three, Network(fast, slow)))
    # through rank 0: its own link carries both other hosts' gradients, the straggler's link only its own
    assert root(size, three, even) == pytest.approx(4 * 100e-6 + 2 * 2 * size / (125 * MB))
    assert root(size, three, straggling) == pytest.approx(4 * 100e-6 + 2 * size / (12.5 * MB))
    assert root(size, three, Network(fast, fast, slow, slow_is_root=True)) == pytest.approx(
        4 * 100e-6 + 2 * 2 * size / (12.5 * MB))
    assert Network.from_dict(straggling.as_dict()) == straggling
    # bench JSONs of before read alike
    assert Network.from_dict(even.as_dict()) == even and "slow" not in even.as_dict()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with hosts_brought_up(tmp_path_factory.mktemp("straggle"), PREFIX, SUBNET, count=3, slots=1) as made:
        yield made


def ring_job(hosts, tmp_path, name: str, *extra: str):
    summary = tmp_path / f"{name}.json"
    result = mpirun(3, ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "96", "--max-steps",
                        "6", "--log-every", "3", "--sync", "ring", "--link", "1gbit", "--summary-json", str(summary),
                        *extra],
                    timeout=240, cwd=tmp_path, **hosts.mpirun_options())
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return json.loads(summary.read_text()), result.stdout


@pytest.mark.e2e
def test_a_host_at_a_tenth_of_the_others_rate_is_named_and_its_cost_predicted(hosts, tmp_path):
    hosts.script("shape", "1gbit")
    even, even_output = ring_job(hosts, tmp_path, "even", "--no-tracking")
    assert "slow_host" not in even and "slow host" not in even_output, even_output

    hosts.script("shape", "100mbit", "3")  # one host's link at a tenth of the others'
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    slow, output = ring_job(hosts, tmp_path, "slow", "--tracking-uri", uri, "--experiment", "straggler")
    name = hosts.host(3)
    assert re.search(rf"slow host: host {name} \(rank 2\): its link measured [\d.]+ MB/s against [\d.]+ MB/s",
                     output), output
    straggler = slow["slow_host"]
    assert straggler["host"] == name and straggler["ranks"] == [2]
    assert straggler["bandwidth"] < 0.2 * straggler["others_bandwidth"]

    measured = slow["mean_times_after_warmup"]["sync_time_s"] - even["mean_times_after_warmup"]["sync_time_s"]
    predicted = straggler["cost_s"]
    print(f"straggler at 100 Mbit/s among 1 Gbit/s hosts: sync +{measured:.3f} s per step measured, "
          f"+{predicted:.3f} s predicted")  # shown with pytest -s
    assert 0.6 <= measured / predicted <= 1.6, (measured, predicted)

    client = client_for(uri)
    parent, _ = job_runs(client, "straggler", "ring-np3-seed42")  # the job's default run name
    assert parent.data.tags["mpi_train.slow_host"] == name and parent.data.tags["mpi_train.slow_host_ranks"] == "2"
    assert parent.data.metrics["summary/slow_host_cost_s"] == pytest.approx(predicted)

    report = subprocess.run([sys.executable, "-m", "mpi_train", "compare", "--tracking-uri", uri, "--experiment",
                             "straggler", "--out", str(tmp_path / "plots")],
                            capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert report.returncode == 0, report.stderr
    assert re.search(rf"slow host {name} \(rank 2\).*it costs about {1000 * predicted:.0f} ms per step",
                     report.stdout), report.stdout
