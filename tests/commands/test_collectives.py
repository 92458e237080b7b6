"""The cluster check: closed-form collectives under a real mpirun, and its report."""

import pytest
from conftest import mpirun

from mpi_train.commands.collectives import CHECKS, format_table


@pytest.mark.e2e
def test_cluster_check_passes_on_four_ranks():
    result = mpirun(4, ["--size-mb", "1", "--iters", "3"], module="mpi_train collectives")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.strip()[:1].isdigit() and "ok" in line]
    assert len(rows) == 4 and all(line.split()[2:] == ["ok"] * len(CHECKS) for line in rows)
    assert "busbw" in result.stdout and "all collectives correct" in result.stdout
    ratio = next(line for line in result.stdout.splitlines() if line.startswith("reduce_scatter "))
    assert float(ratio.split("x the all_reduce")[0].rsplit(" ", 1)[1]) > 0


def test_table_marks_a_wrong_result():
    good = dict.fromkeys(CHECKS, True)
    table = format_table([good, {**good, "gather": False}], ["a", "b"])
    assert table.splitlines()[2].split()[:2] == ["1", "b"] and "WRONG" in table.splitlines()[2]
    assert "WRONG" not in table.splitlines()[1]
