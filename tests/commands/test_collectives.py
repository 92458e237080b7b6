"""The cluster check: closed-form collectives under a real mpirun, and its report."""

from argparse import Namespace

import pytest
from conftest import mpirun

from mpi_train.commands.collectives import CHECKS, check_numbers, format_table
from mpi_train.errors import UserError


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


@pytest.mark.parametrize("numbers, said", [
    ({"size_mb": -1.0}, "--size-mb must be above 0 and up to 1e.06 MiB, got -1"),
    ({"size_mb": float("nan")}, "--size-mb must be above 0 and up to 1e.06 MiB, got nan"),
    ({"iters": 0}, "--iters is how many times each collective is timed, at least 1; got 0"),
    ({"timeout": float("nan")}, "--timeout nan is out of range"),
])
def test_the_checks_numbers_are_refused_before_any_collective(numbers, said):
    """Each once ended every rank in a traceback (a negative dimension, NaN to int, a division by zero), or printed
    a negative bandwidth with exit 0 (--iters -3)."""
    check_numbers(Namespace(size_mb=16.0, iters=10, timeout=60.0))
    with pytest.raises(UserError, match=said):
        check_numbers(Namespace(**{"size_mb": 16.0, "iters": 10, "timeout": 60.0, **numbers}))
