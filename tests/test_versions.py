"""Ranks must run the same torch and the same code, and read the same data: how they differ is said in one clause."""

import shutil

import pytest

from mpi_train import versions
from mpi_train.cluster import disagreement
from mpi_train.errors import UserError

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
    mine = versions.software()
    assert mine["torch"] and "+" not in mine["torch"] and len(mine["mpi_train's code"]) == 12
    versions.check_same_software([mine, dict(mine)], ("a", "b"))
    copy = shutil.copytree(versions.PACKAGE, tmp_path / "mpi_train")
    monkeypatch.setattr(versions, "PACKAGE", copy)
    assert versions.code_digest.__wrapped__() == mine["mpi_train's code"]
    (copy / "clock.py").write_text((copy / "clock.py").read_text() + "# changed on one host\n")
    theirs = {**mine, "mpi_train's code": versions.code_digest.__wrapped__()}
    assert theirs != mine
    with pytest.raises(UserError, match=r"^the ranks run different software \(rank 0 on a: mpi_train's code \w+; "
                                        r"rank 1 on b: mpi_train's code \w+\)\. Every host must run the same torch"):
        versions.check_same_software([mine, theirs], ("a", "b"))
