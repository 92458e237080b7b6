"""Every command the README and docs/ write down still runs: `--help` for each subcommand, `--dry-run` for each
experiment file they name, none of the old `python -m mpi_train.X` forms, and one installed command."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import pytest
import tomllib
from conftest import MPI_ENV, REPO

from mpi_train.cli import DEFAULT, SUBCOMMANDS
from mpi_train.lab.experiment import main as experiment_main

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:python -m mpi_train|mpi-train)\b((?: +[^\s`|;&]+)*)")
OLD_FORMS = re.compile(r"python -m mpi_train\.[a-z_]+|mpi-train-[a-z]")  # before one command had subcommands
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def documented() -> dict[str, set[str]]:
    """Each documented subcommand (train for a flag first), with the experiment files written after it."""
    found: dict[str, set[str]] = {}
    for path in DOCUMENTS:
        for rest in COMMAND.findall(path.read_text()):
            words = rest.split()
            name = words[0] if words and words[0] in SUBCOMMANDS else DEFAULT
            files = {word for word in words if word.endswith(".toml") and (REPO / word).is_file()}
            found.setdefault(name, set()).update(files)
    return found


def test_the_documents_name_the_commands():
    commands = documented()
    assert {"train", "experiment", "bench", "soak"} <= set(commands)
    assert "experiments/smoke.toml" in commands["experiment"]


def test_the_documents_name_no_old_form():
    old = [f"{path.name}: {match}" for path in DOCUMENTS for match in OLD_FORMS.findall(path.read_text())]
    assert not old, "old command forms (now python -m mpi_train SUBCOMMAND):\n" + "\n".join(old)


HELP_EACH = """
import contextlib, io, sys
from mpi_train.cli import main
for name in sys.argv[1:]:
    argv, out = ([name] if name != "-" else []) + ["--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = main(argv)
    except SystemExit as end:
        code = end.code or 0
    print(f"{name}\t{code}\t{'usage:' in out.getvalue()}", file=sys.stderr, flush=True)
"""


def test_every_documented_command_answers_help():
    """`mpi-train --help` and each documented subcommand's --help, in one process that imports torch once."""
    names = ["-", *sorted(documented())]
    done = subprocess.run([sys.executable, "-c", HELP_EACH, *names], cwd=REPO, text=True, capture_output=True,
                          env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO)}, timeout=180, check=False)
    answers = dict(line.split("\t", 1) for line in done.stderr.splitlines() if line.split("\t", 1)[0] in names)
    assert done.returncode == 0 and answers == dict.fromkeys(names, "0\tTrue"), done.stderr[-3000:]


@pytest.mark.parametrize("experiment_file", sorted({f for files in documented().values() for f in files}))
def test_every_documented_experiment_file_is_valid(experiment_file, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert experiment_main([experiment_file, "--dry-run"]) == 0, capsys.readouterr().err
    assert "run(s)" in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(SCRIPTS))
def test_every_console_command_points_at_a_function(command):
    module, _, function = SCRIPTS[command].partition(":")
    assert callable(getattr(importlib.import_module(module), function)), SCRIPTS[command]


def test_one_console_command():
    assert SCRIPTS == {"mpi-train": "mpi_train.cli:console_main"}


def test_an_installed_console_command_runs():
    path = os.path.join(os.path.dirname(sys.executable), "mpi-train")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: install the package (pip install -e .) so pip writes its command")
    result = subprocess.run([path, "predict", "--help"], capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert result.returncode == 0 and "usage: python -m mpi_train predict" in result.stdout, result.stderr


@pytest.mark.e2e
def test_mpi_train_command_trains_under_mpirun(tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "mpi-train")
    result = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", command, "--dataset", "synthetic",
                             "--synthetic-size", "256", "--batch-size", "64", "--max-steps", "2", "--no-tracking"],
                            capture_output=True, text=True, timeout=240, cwd=tmp_path,
                            env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO)},
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "2 rank(s) on 1 host(s)" in result.stdout and "done in" in result.stdout


def test_the_readme_command_table_names_every_subcommand():
    text = (REPO / "README.md").read_text()
    table = text[text.index("### Commands"):text.index("## Documentation")]
    assert all(f"`{name}`" in table for name in SUBCOMMANDS), [name for name in SUBCOMMANDS if f"`{name}`" not in table]
