"""The probe of user-caused faults (`soak --bad-input`, lab/bad_input.py and its standard, lab/bad_input_judge.py):
each rule of the standard fails on the real output and leftovers of a finished process that breaks it, and passes
one that keeps it. The cases themselves are real mpirun jobs: the probe is a command, run by hand (docs/results.md),
not a test.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch

from mpi_train.data import cache
from mpi_train.errors import UserError
from mpi_train.lab import bad_input_judge
from mpi_train.lab.bad_input import CASES, COLUMNS, Row, chosen, format_table
from mpi_train.lab.bad_input_cases import same_message
from mpi_train.lab.bad_input_judge import Run, judge, launch, message, processes_of
from mpi_train.lab.bad_input_workspace import Setups, Workspace, fill

FULL_DISK = "mpi_train: error: writing ck/step-00000003.pt failed (No space left on device); nothing of it is left."


def python(folder: Path, code: str, timeout_s: float = 60, damaged: dict | None = None) -> Run:
    return launch([sys.executable, "-c", code], folder, timeout_s, damaged or {})


def says(text: str, code: int) -> str:
    return f"import sys; print({text!r}, file=sys.stderr); sys.exit({code})"


def test_a_clear_error_keeps_every_rule(tmp_path):
    run = python(tmp_path, says(FULL_DISK, 2))
    assert (run.exit, run.left, run.half_written) == (2, [], [])
    assert judge(run, (r"no space left",)) == []
    assert message(run.output) == FULL_DISK


def test_a_traceback_fails_and_so_does_a_message_that_misses_the_cause(tmp_path):
    run = python(tmp_path, "raise OSError(28, 'No space left on device')")
    assert run.exit == 1
    assert judge(run, (r"no space left",)) == ["TRACEBACK"]
    assert judge(run, (r"no space left", r"step-00000003\.pt")) == ["TRACEBACK", "CAUSE NOT NAMED"]
    assert message(run.output) == "OSError: [Errno 28] No space left on device"


def test_a_fault_that_ends_with_exit_status_0_fails(tmp_path):
    assert judge(python(tmp_path, says(FULL_DISK, 0)), (r"no space left",)) == ["EXIT 0"]


def test_a_wrapped_message_still_names_its_cause():
    wrapped = Run(2, "mpi_train: error: --summary-json results is a\nfolder, not a file.\n", 1.0)
    assert judge(wrapped, (r"--summary-json\b.{0,200}\b(folder|directory)\b",)) == []


def test_a_run_past_its_timeout_is_a_hang(tmp_path):
    run = python(tmp_path, "import time; time.sleep(60)", timeout_s=1)
    assert run.exit is None and run.seconds < 15
    assert judge(run, (r"no space left",)) == ["HANG", "CAUSE NOT NAMED"]
    assert processes_of(tmp_path) == []


def test_a_process_left_running_fails_and_is_ended(tmp_path, monkeypatch):
    monkeypatch.setattr(bad_input_judge, "SETTLE_S", 0.5)
    run = python(tmp_path, "import subprocess, sys, time\n"
                           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
                           "start_new_session=True)\n" + says(FULL_DISK, 2))
    assert len(run.left) == 1 and "time.sleep(120)" in run.left[0]
    assert judge(run, (r"no space left",)) == ["LEFT RUNNING"]
    assert processes_of(tmp_path) == []  # ended once counted


def test_what_a_run_leaves_half_written_fails_but_not_what_was_there_or_broken_on_purpose(tmp_path):
    (tmp_path / "there").mkdir()  # an empty folder from before the run
    torch.save({"format": 1, "world_size": 1, "ranks": [{}]}, tmp_path / "step-00000001.pt")
    broken = tmp_path / "step-00000002.pt"
    broken.write_bytes(os.urandom(4096))
    code = ("import os, pathlib\n"
            "pathlib.Path('ck').mkdir(); pathlib.Path('ck/.step-00000003.pt.77.partial').write_bytes(b'x')\n"
            "pathlib.Path('out/logs').mkdir(parents=True)\n"
            "pathlib.Path('ck/step-00000004.pt').write_bytes(os.urandom(4096))\n"
            f"pathlib.Path('data/{cache.CACHE_FOLDER}').mkdir(parents=True)\n"
            f"pathlib.Path('data/{cache.CACHE_FOLDER}/cifar10-train.pt').write_bytes(b'PK' + os.urandom(100))\n"
            + says(FULL_DISK, 2))
    run = python(tmp_path, code, damaged={broken: b""})
    assert run.half_written == ["ck/.step-00000003.pt.77.partial (a .partial file)",
                                "ck/step-00000004.pt (a checkpoint that cannot be read)",
                                f"data/{cache.CACHE_FOLDER}/cifar10-train.pt (a damaged data cache)",
                                "out/ (an empty folder)"]
    assert judge(run, (r"no space left",)) == ["HALF-WRITTEN"]


def test_a_warning_must_be_said_and_must_not_stop_the_job(tmp_path):
    warning = "mpi_train: warning: blob.bin is not UTF-8 text (a binary file?); training on its bytes anyway."
    causes = (r"\bwarning\b.{0,300}\b(utf-8|binary)\b",)
    assert judge(python(tmp_path, says(warning, 0)), causes, warning=True) == []
    assert judge(python(tmp_path, says(warning, 2)), causes, warning=True) == ["EXIT 2"]
    assert judge(python(tmp_path, "print('done')"), causes, warning=True) == ["NO WARNING"]


def test_a_second_attempt_must_meet_the_same_message(tmp_path):
    first = python(tmp_path, says(FULL_DISK, 2))
    again = python(tmp_path, says(FULL_DISK, 2))
    other = python(tmp_path, "raise FileExistsError(17, 'File exists')")
    assert same_message(None, [first, again]) == []
    assert same_message(None, [first, other]) == ["MESSAGE CHANGED"]


def test_the_table_names_the_rules_broken_and_the_message():
    rows = [Row("lr-inf", [Run(2, FULL_DISK, 3.0)]),
            Row("corrupt-image", [Run(1, "Traceback (most recent call last):\nPIL.UnidentifiedImageError: cannot "
                                         "identify image file\n", 8.5)], ["TRACEBACK", "CAUSE NOT NAMED"]),
            Row("full-disk-cache", not_run="mounting a tmpfs needs root")]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == list(COLUMNS)
    assert lines[2].split() == ["lr-inf", "2", "3.0", "ok"]
    assert "TRACEBACK, CAUSE NOT NAMED" in lines[3] and "UnidentifiedImageError: cannot identify" in lines[3]
    assert "NOT RUN" in lines[4] and "needs root" in lines[4]


def test_cases_are_chosen_by_name():
    assert len({case.name for case in CASES}) == len(CASES)
    assert [case.name for _, case in chosen("lr-inf, full-disk-cache")] == ["full-disk-cache", "lr-inf"]
    assert [number for number, _ in chosen(None)] == list(range(1, len(CASES) + 1))
    with pytest.raises(UserError, match="names lr-huge, which is not a case"):
        chosen("lr-inf,lr-huge")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_the_full_disk_is_full_and_unmounted_on_every_way_out(tmp_path):
    (tmp_path / "case").mkdir()
    with pytest.raises(OSError, match="No space left"), ExitStack() as stack:
        disk = Workspace(tmp_path / "case", tmp_path, stack, Setups(tmp_path)).disk()
        assert os.path.ismount(disk)
        fill(disk, 0)
        (disk / "more").write_bytes(bytes(1 << 20))
    assert not os.path.ismount(disk)
