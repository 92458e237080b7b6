"""Rank discovery and per-rank set-up, in one process (MPI as a singleton)."""


import pytest
import torch

from mpi_train.cluster import Cluster, RankInfo, address_on_other_host, host_labels, listen_on, rendezvous_address
from mpi_train.errors import UserError
from mpi_train.models import build_model
from mpi_train.train import parameter_digest


def test_without_a_launcher_the_job_is_one_rank():
    cluster = Cluster.from_mpi()
    assert cluster.info == RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, host=cluster.hosts[0])
    assert not cluster.spans_hosts


def test_one_host_rendezvous_is_loopback_unless_overridden(monkeypatch):
    cluster = Cluster.from_mpi()
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert rendezvous_address(cluster, None) == "127.0.0.1"
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    assert rendezvous_address(cluster, None) == "10.1.2.3"
    assert rendezvous_address(cluster, "10.9.9.9") == "10.9.9.9"  # the flag beats the variable


def test_parameter_digest_tells_replicas_apart():
    torch.manual_seed(1)
    a = build_model("mnist_cnn")
    torch.manual_seed(1)
    b = build_model("mnist_cnn")
    assert parameter_digest(a) == parameter_digest(b)
    with torch.no_grad():
        next(b.parameters()).view(-1)[0] += 1e-6
    assert parameter_digest(a) != parameter_digest(b)


def test_hosts_are_what_mpi_groups_and_names_only_label_them():
    # two namespaces or containers both called "node": MPI says ranks 0,1 and 2,3 share memory
    assert host_labels([("node", 0), ("node", 0), ("node", 2), ("node", 2)]) == (
        "node-rank0", "node-rank0", "node-rank2", "node-rank2")
    assert host_labels([("a", 0), ("a", 0), ("b", 2)]) == ("a", "a", "b")  # distinct names stay as they are


def test_rendezvous_routes_towards_an_address_only_the_other_host_has():
    hosts = ("a", "a", "b", "b")
    # every host has the container bridge 172.17.0.1; only 10.0.0.2 is b's own
    addresses = [["172.17.0.1", "10.0.0.1"], ["172.17.0.1", "10.0.0.1"], ["172.17.0.1", "10.0.0.2"], []]
    assert address_on_other_host(hosts, addresses) == "10.0.0.2"
    with pytest.raises(UserError, match="--master-addr"):
        address_on_other_host(hosts, [["10.0.0.1"], ["10.0.0.1"], ["10.0.0.1"], []])


@pytest.mark.parametrize("address, why", [
    ("no-such-host.invalid", "it is a name that does not resolve on rank 0's host"),
    ("127.0.0.1:9999", "it names a port too, and rank 0 picks a free port itself: give the address alone"),
    ("::1", "it is an IPv6 address, and the rendezvous listens on IPv4"),
    ("192.0.2.1", "it is not an address of rank 0's host"),
])
def test_an_address_rank_0_cannot_listen_on_is_told_by_what_is_wrong_with_it(address, why):
    with pytest.raises(UserError) as refused:
        listen_on(address)
    assert why in str(refused.value) and "Pass --master-addr" in str(refused.value)


def test_gloo_interfaces_this_host_lacks_are_found_before_gloo_would_fail():
    from mpi_train.cluster import missing_interfaces

    assert missing_interfaces("lo, nosuch0,") == ["nosuch0"] and missing_interfaces("lo") == []
    assert missing_interfaces("") == []  # unset: Gloo's own choice
