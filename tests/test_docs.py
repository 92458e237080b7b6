"""Every command the README and docs/ write down still runs: `--help` for each module, `--dry-run` for each
experiment file they name, and every installed console command points at a function that exists."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import pytest
import tomllib
from conftest import MPI_ENV, REPO

from mpi_train.lab.experiment import main as experiment_main

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"python -m (mpi_train(?:\.[a-z_]+)?)((?: +[^\s`|;&]+)*)")
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def documented() -> dict[str, set[str]]:
    """Each documented module, with the experiment files written after it."""
    found: dict[str, set[str]] = {}
    for path in DOCUMENTS:
        for module, rest in COMMAND.findall(path.read_text()):
            files = {word for word in rest.split() if word.endswith(".toml") and (REPO / word).is_file()}
            found.setdefault(module, set()).update(files)
    return found


def test_the_documents_name_the_commands():
    modules = documented()
    assert {"mpi_train", "mpi_train.experiment", "mpi_train.bench", "mpi_train.soak"} <= set(modules)
    assert "experiments/smoke.toml" in modules["mpi_train.experiment"]


HELP_EACH = """
import contextlib, io, runpy, sys
for module in sys.argv[1:]:
    sys.argv, out = [module, "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as end:
        code = end.code or 0
    print(f"{module}\t{code}\t{'usage:' in out.getvalue()}", file=sys.stderr, flush=True)
"""


def test_every_documented_command_answers_help():
    """Each run as `python -m MODULE --help` runs it (its __main__ block), in one process that imports torch once."""
    modules = sorted(documented())
    done = subprocess.run([sys.executable, "-c", HELP_EACH, *modules], cwd=REPO, text=True, capture_output=True,
                          env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO)}, timeout=180, check=False)
    answers = dict(line.split("\t", 1) for line in done.stderr.splitlines() if line.split("\t", 1)[0] in modules)
    assert done.returncode == 0 and answers == dict.fromkeys(modules, "0\tTrue"), done.stderr[-3000:]


@pytest.mark.parametrize("experiment_file", sorted({f for files in documented().values() for f in files}))
def test_every_documented_experiment_file_is_valid(experiment_file, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert experiment_main([experiment_file, "--dry-run"]) == 0, capsys.readouterr().err
    assert "run(s)" in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(SCRIPTS))
def test_every_console_command_points_at_a_function(command):
    module, _, function = SCRIPTS[command].partition(":")
    assert callable(getattr(importlib.import_module(module), function)), SCRIPTS[command]


def test_an_installed_console_command_runs():
    path = os.path.join(os.path.dirname(sys.executable), "mpi-train-predict")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: install the package (pip install -e .) so pip writes its commands")
    result = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert result.returncode == 0 and "usage: python -m mpi_train.predict" in result.stdout, result.stderr


@pytest.mark.e2e
def test_mpi_train_command_trains_under_mpirun(tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "mpi-train")
    result = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", command, "--dataset", "synthetic",
                             "--synthetic-size", "256", "--batch-size", "64", "--max-steps", "2", "--no-tracking"],
                            capture_output=True, text=True, timeout=240, cwd=tmp_path, env={**os.environ, **MPI_ENV},
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "2 rank(s) on 1 host(s)" in result.stdout and "done in" in result.stdout
