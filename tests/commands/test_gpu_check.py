"""The GPU check's own code, dry-run on CPUs under Gloo (the GPU figures themselves are in docs/results.md)."""

import re
import subprocess
import sys

import pytest
from conftest import REPO

from mpi_train.commands.gpu_check import combinations, table
from mpi_train.sync import SYNC_METHODS, every_label, label


def test_every_method_and_compression_is_checked_that_the_backend_runs():
    nccl = {label(*pair) for pair in combinations("nccl", list(SYNC_METHODS))}
    assert nccl == set(every_label())  # all of them under NCCL
    gloo = {label(*pair) for pair in combinations("gloo", list(SYNC_METHODS))}
    assert "ddp_powersgd" in nccl and "ddp_powersgd" not in gloo and "bucketed+powersgd" in gloo


def test_the_table_counts_what_failed():
    text = table([{"check": "a", "ok": True, "figure": "1"}, {"check": "bb", "ok": False, "figure": "2"}], "cpu")
    assert text.splitlines()[-1] == "1 passed, 1 failed" and "FAIL" in text.splitlines()[3]


@pytest.mark.e2e
def test_the_check_dry_runs_on_cpus():
    result = subprocess.run([sys.executable, "-m", "mpi_train", "gpu-check", "--backend", "gloo", "--model",
                             "gpt", "--gpt-layers", "1", "--gpt-width", "32", "--context", "16", "--batch-size", "32",
                             "--steps", "2", "--timed-steps", "3", "--methods",
                             "ddp"], cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    rows = result.stdout.split("GPU check on cpu x 1")[1].strip().splitlines()
    assert re.match(r"  ddp: 2 steps +ok +loss \d", rows[2]), rows
    assert re.search(r"resumed to step 6, --deterministic +ok +weights equal bit for bit", rows[4]), rows
    # the step's ratio on a CPU is no target: it may fail here, and the exit status says so
    passed, failed = map(int, re.match(r"(\d) passed, (\d) failed", rows[5]).groups())
    assert passed + failed == 3 and result.returncode == (1 if failed else 0), result.stdout + result.stderr
