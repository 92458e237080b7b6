"""Ranks must run the same torch, code and settings (and read the same data): how they differ is said in one
clause."""

import re
import shutil
import sys
import time

import pytest
from conftest import mpirun_launch

from mpi_train import same_job
from mpi_train.cluster import disagreement
from mpi_train.errors import UserError
from mpi_train.lab import mpirun as launch

HOSTS = ("a", "a", "b", "c")


def test_ranks_that_agree_say_nothing_and_those_that_differ_are_grouped_by_what_they_hold():
    same = [{"torch": "2.14.1", "code": "x"}] * 4
    assert disagreement(same, HOSTS) is None
    differ = [*same[:3], {"torch": "2.11.0", "code": "x"}]
    assert disagreement(differ, HOSTS) == "ranks 0, 1, 2 on a, b: torch 2.14.1; rank 3 on c: torch 2.11.0"
    counted = [{"training samples": 64 + rank} for rank in range(6)]
    said = disagreement(counted, tuple("abcdef"))
    assert said.startswith("rank 0 on a: training samples 64; rank 1 on b: training samples 65;")
    assert said.endswith("; and 2 more")
    assert disagreement([{"classes": 3}, {}], ("a", "b")) == "rank 0 on a: classes 3; rank 1 on b: classes none"


def test_another_version_of_one_file_or_of_torch_is_refused_naming_each_ranks(tmp_path, monkeypatch):
    mine = same_job.software()
    assert mine["torch"] and "+" not in mine["torch"] and len(mine["mpi_train's code"]) == 12
    same_job.check_same_software([mine, dict(mine)], ("a", "b"))
    copy = shutil.copytree(same_job.PACKAGE, tmp_path / "mpi_train")
    monkeypatch.setattr(same_job, "PACKAGE", copy)
    assert same_job.code_digest.__wrapped__() == mine["mpi_train's code"]
    (copy / "clock.py").write_text((copy / "clock.py").read_text() + "# changed on one host\n")
    theirs = {**mine, "mpi_train's code": same_job.code_digest.__wrapped__()}
    assert theirs != mine
    with pytest.raises(UserError, match=r"^the ranks run different software \(rank 0 on a: mpi_train's code \w+; "
                                        r"rank 1 on b: mpi_train's code \w+\)\. Every host must run the same torch"):
        same_job.check_same_software([mine, theirs], ("a", "b"))


@pytest.mark.e2e
def test_ranks_given_other_settings_are_refused_before_any_work_naming_the_flag(tmp_path):
    """An MPMD launch whose second rank has another batch, as a host's edited copy of a --config file would give:
    before, each rank trained its own number of steps until the first waited past --timeout."""
    flags = ["--dataset", "synthetic", "--no-tracking", "--timeout", "20", "--checkpoint-dir", str(tmp_path / "ck")]
    command, env = mpirun_launch(1, [*flags, "--batch-size", "64"])
    command += [":", "-np", "1", sys.executable, "-m", "mpi_train", *flags, "--batch-size", "128"]
    started = time.monotonic()
    result = launch.run(command, env=env, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and time.monotonic() - started < 20  # refused, not timed out
    assert ("mpi_train: error: the ranks were given different settings (rank 0 on" in result.stderr
            and re.search(r"rank 0 on [^:]+: --batch-size 64; rank 1 on [^:]+: --batch-size 128\)", " ".join(
                result.stderr.split())))
    assert result.stderr.count("different settings") == 1 and not (tmp_path / "ck").exists()  # once; nothing made
