"""One mpirun of a sweep: the time left it estimates and the line that says why a run failed."""

from pathlib import Path

import pytest

from mpi_train.lab.sweep_launch import Launch, Progress, last_error

# a run's whole output (Open MPI 5) when its hostfile names a host that does not resolve: ssh's own line, then
# mpirun's banner
UNKNOWN_HOST_OUTPUT = """\
ssh: Could not resolve hostname nohost.invalid: Name or service not known
------------------------------------------------------------
A daemon failed to report back after being spawned. This could
be due to several factors, including inability to find the
daemon executable, or the executable was unable to find its
required supporting libraries. In some cases, the daemon was
able to execute, but was unable to complete a TCP connection
back to prterun:

  Local host:    vm
  Remote host:   nohost
  Daemon exit status: 255

This may also be caused by a firewall on the remote host. Please
check that any firewall (e.g., iptables) has been disabled and
try again.
------------------------------------------------------------
"""


def test_a_run_whose_host_cannot_be_reached_is_reported_in_ssh_s_own_words():
    assert last_error(UNKNOWN_HOST_OUTPUT.splitlines()) == \
        "ssh: Could not resolve hostname nohost.invalid: Name or service not known"


def test_a_run_refused_in_one_paragraph_is_reported_whole_and_mpirun_s_refusal_in_its_words():
    refused = ["mpi_train: error: --save-model stores the weights in the job's MLflow run, which --no-tracking turns",
               "off. Drop one of them.", "--------------------------------------", "prterun detected that one or",
               "\x00"]
    assert last_error(refused) == ("mpi_train: error: --save-model stores the weights in the job's MLflow run, which "
                                   "--no-tracking turns off. Drop one of them.")
    assert last_error(["", "There are not enough slots available in the system to satisfy the 8", "slots", "\x00"]) == \
        "There are not enough slots available in the system to satisfy the 8"
    assert last_error(["mpirun said little", "\x00", ""]) == "mpirun said little"
    duplicate_host = ["-" * 74, "A hostfile was provided that contains multiple definitions of the slot",
                      "count for at least one node:", "", "   hostfile:  /tmp/hf", "", "-" * 74, " "]
    assert last_error(duplicate_host) == ("A hostfile was provided that contains multiple definitions of the slot "
                                          "count for at least one node:")  # once its closing line of dashes


def test_time_left_counts_later_runs_by_their_steps():
    # 1 s/step, 10 s start-up
    done = Launch(index=1, name="a", command=[], steps=10, log=Path("a"), returncode=0,
                  first=(12.0, 2), last=(20.0, 10))
    current = Launch(index=2, name="b", command=[], steps=10, log=Path("b"), steps_done=4,
                     first=(15.0, 2), last=(19.0, 4))  # 2 s/step
    later = Launch(index=3, name="c", command=[], steps=30, log=Path("c"))
    assert Progress([done, current, later]).estimate_left(current) == pytest.approx(6 * 2.0 + 10 + 30 * 1.0)
