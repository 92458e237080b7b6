"""An mpirun line's hosts: read from --hostfile or --host, asked whether they answer, written again without one."""

import os

import pytest

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.lab import launchline
from mpi_train.lab import mpirun as launch

TRAIN = ["python", "-m", "mpi_train", "--batch-size", "96", "--checkpoint-dir", "ck"]


def test_the_hosts_and_slots_come_from_the_hostfile_or_the_host_list(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\nnode1 slots=2\nnode2 slots=2 max_slots=4\n\nnode3\nnode3\n")
    placed = launchline.placement(["mpirun", "-np", "6", "--hostfile", str(hostfile), *TRAIN])
    assert placed == launchline.Placement((("node1", 2), ("node2", 2), ("node3", 2)), 6, 96)
    assert launchline.placement(["mpiexec", "--host", "a:3,b:3", *TRAIN]).ranks == 6  # -np from the slots
    assert launchline.placement(["mpirun", "-H", "a,a,b", "python", "-m", "mpi_train"]).batch_size == 256  # default
    assert launchline.placement(["mpirun", "-np", "2", *TRAIN]) is None  # one host: nothing to leave out
    assert launchline.placement(["torchrun", "--nproc-per-node", "2", "-m", "mpi_train"]) is None
    with pytest.raises(UserError, match="could not be read"):
        launchline.placement(["mpirun", "--hostfile", str(tmp_path / "missing"), *TRAIN])
    with pytest.raises(UserError, match=r"could not be read \(-np 'two' is not a whole number\)"):
        launchline.placement(["mpirun", "-np", "two", "--host", "a:2,b:2", "python"])


def test_fewer_hosts_run_as_many_ranks_as_split_the_global_batch():
    placed = launchline.Placement((("a", 4), ("b", 4), ("c", 4)), 12, 96)
    assert launchline.Placement((("a", 4), ("c", 4)), 8, 96) == placed.fewer({"b"}, min_ranks=2)
    odd = launchline.Placement((("a", 3), ("b", 3), ("c", 1)), 7, 96)
    assert odd.fewer({"c"}, min_ranks=2).ranks == 6  # 6 slots left, and 96 splits 6 ways
    assert launchline.Placement((("a", 5), ("b", 5)), 10, 96).fewer({"b"}, 2).ranks == 4  # not 5: 96 % 5
    assert placed.fewer({"a", "b"}, min_ranks=5) is None  # 4 slots left


def test_fewer_hosts_under_accumulate_run_as_many_ranks_as_the_resharded_job_accepts():
    line = ["mpirun", "-H", "a:8,b:4", "python", "-m", "mpi_train", "--batch-size", "96", "--accumulate", "8"]
    smaller = launchline.placement(line).fewer({"b"}, min_ranks=1)
    assert smaller.ranks == 6  # not 8: 96 over 8 ranks is 12 samples each, which 8 micro-batches do not split
    TrainConfig(dataset="synthetic", batch_size=96, accumulate=8, resume="ck", reshard=True).validate(smaller.ranks)


def test_the_line_is_written_again_on_the_hosts_left(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=2\n")
    line = ["mpirun", "-np", "4", "--hostfile", str(hostfile), *TRAIN, "--resume", "auto"]
    smaller = launchline.placement(line).fewer({"b"}, 1)
    again = launchline.on_hosts(line, smaller, tmp_path)
    assert again[:5] == ["mpirun", "-np", "2", "--hostfile", str(tmp_path / "hostfile")]
    assert again[5:] == [*TRAIN, "--resume", "auto", "--reshard"]
    assert (tmp_path / "hostfile").read_text() == "a slots=2\n"
    assert hostfile.read_text() == "a slots=2\nb slots=2\n"  # the user's own file is left as it was
    assert launchline.on_hosts(again, smaller, tmp_path).count("--reshard") == 1

    listed = ["mpirun", "--host=a:2,b:2", *TRAIN]
    assert launchline.on_hosts(listed, launchline.placement(listed).fewer({"a"}, 1), tmp_path)[:4] == \
        ["mpirun", "-np", "2", "--host=b:2"]


def test_a_host_answers_when_mpirun_starts_a_process_there():
    env = {**os.environ, **launch.OPEN_MPI_ENV}
    assert launchline.answering(["mpirun"], ["localhost", "no-such-host.invalid"], env) == {"localhost"}
