"""The GPU check's command: its flags refused up front, and its own code dry-run on CPUs under Gloo."""

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO

from mpi_train.cluster import Cluster
from mpi_train.commands.gpu_check import check_paths, chosen_parts, parse_args
from mpi_train.errors import UserError


@pytest.mark.parametrize("words, refusal", [
    (["--parts", "step,bogus"], "--parts 'step,bogus' names bogus; name parts of step, epoch"),
    (["--parts", ","], "names no part"),
    (["--steps", "0"], "--steps must be positive, got 0."),
    (["--methods", "ddp,dpp"], "--methods names dpp, which is no sync method"),
])
def test_the_flags_are_refused_before_any_job_trains(words, refusal):
    with pytest.raises(UserError, match=re.escape(refusal)):
        chosen_parts(parse_args(["--backend", "gloo", *words], quiet=True))


def test_the_parts_are_a_comma_separated_list():
    assert chosen_parts(parse_args(["--backend", "gloo", "--parts", " resume,step "], quiet=True)) == ["resume", "step"]


def test_a_data_dir_or_a_json_that_cannot_serve_is_refused_before_the_check_runs(tmp_path):
    (tmp_path / "afile").write_text("")
    for flags, refusal in ((["--data-dir", "afile"], "--data-dir afile is a file, not a folder: the one-epoch check"),
                           (["--json", "afile/rows.json"], "--json afile/rows.json lies under")):
        args = parse_args(["--backend", "gloo", *(str(tmp_path / f) if f.startswith("afile") else f for f in flags)],
                          quiet=True)
        with pytest.raises(UserError, match=re.escape(refusal.replace("afile", str(tmp_path / "afile")))):
            check_paths(Cluster.from_mpi(), args, chosen_parts(args))


@pytest.mark.e2e
def test_the_check_dry_runs_on_cpus(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mpi_train", "gpu-check", "--backend", "gloo", "--model",
                             "gpt", "--gpt-layers", "1", "--gpt-width", "32", "--context", "16", "--batch-size", "32",
                             "--steps", "2", "--timed-steps", "3", "--methods", "ddp", "--float16-methods", "",
                             "--json", str(tmp_path / "new" / "rows.json")],
                            cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    rows = result.stdout.split("GPU check on cpu x 1")[1].strip().splitlines()
    assert re.match(r"  ddp step / bare loop step, 32-true eager \(target <= 1.1x\) +(ok|FAIL) +[\d.]+ / [\d.]+ ms",
                    rows[2]), rows
    assert re.match(r"  ddp 32-true: 2 steps +ok +loss \d", rows[3]), rows
    assert re.search(r"32-true: checkpoint at step 3 resumed to step 6, --deterministic +ok +weights equal bit for bit",
                     rows[4]), rows
    assert "gpu-check: ok  ddp 32-true: 2 steps: loss" in result.stdout  # each row as it came, before the table
    # the step's ratio on a CPU is no target: it may fail here, and the exit status says so
    passed, failed = map(int, re.match(r"(\d) passed, (\d) failed", rows[5]).groups())
    assert passed + failed == 3 and result.returncode == (1 if failed else 0), result.stdout + result.stderr
    assert len(json.loads((tmp_path / "new" / "rows.json").read_text())) == 3  # its folder made
