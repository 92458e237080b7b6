"""The one command (mpi_train/cli.py): `--help` (or nothing at all) lists every subcommand, the user's before the
lab's, a flag first means train, an unknown name is refused with the list, and each subcommand's module has the main
it runs."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

import mpi_train
from mpi_train.cli import DEFAULT, SUBCOMMANDS, is_rank_program, main, split


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpi_train", *argv], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)


def test_help_lists_every_subcommand_without_importing_torch():
    code = ("import sys; from mpi_train.cli import main; main(['--help']); "
            "print('torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0 and done.stderr.strip() == "False", done.stderr
    lines = done.stdout.splitlines()
    for name, sub in SUBCOMMANDS.items():
        assert f"  {name} " in done.stdout and any(line.split()[:1] == [name] and sub.summary in line
                                                    for line in lines), name


def test_an_unknown_subcommand_is_one_paragraph_naming_the_valid_ones():
    done = run("trian", "--sync", "ddp")
    assert done.returncode == 2 and done.stdout == ""
    message = done.stderr.strip()
    assert message.startswith("mpi-train: error: no subcommand 'trian'") and "\n\n" not in message
    assert all(name in " ".join(message.split()) for name in SUBCOMMANDS)


def test_a_flag_first_means_train_and_nothing_at_all_means_help(capsys):
    assert split(["--sync", "gather_scatter"]) == (DEFAULT, ["--sync", "gather_scatter"]) and DEFAULT == "train"
    assert split(["bench", "--steps", "3"]) == ("bench", ["--steps", "3"])
    assert main(["--help"]) == 0 and "subcommands:" in capsys.readouterr().out
    bare = run()  # the real command with no argument: the help, and no job (a job would need mpirun's ranks)
    assert bare.returncode == 0 and bare.stdout.startswith("usage: mpi-train") and bare.stderr == "", bare.stderr


def test_version_and_the_help_s_two_groups(capsys):
    assert main(["--version"]) == 0 and capsys.readouterr().out == f"mpi-train {mpi_train.__version__}\n"
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    user, lab = text.split("subcommands:")[1].split("the lab's self-checks")
    assert all((f"  {name} " in lab) == sub.lab and (f"  {name} " in user) != sub.lab
               for name, sub in SUBCOMMANDS.items())
    assert [line.split()[0] for line in user.strip().splitlines()][:2] == ["train", "compare"]


def test_rank_programs_are_the_commands_package():
    """What mpirun starts on every rank ends through cluster.exit_process; the rest exit as usual."""
    for name, sub in SUBCOMMANDS.items():
        assert sub.rank == sub.module.startswith("mpi_train.commands."), name
    assert is_rank_program(["bench"]) and is_rank_program(["--sync", "ddp"])
    assert not any(map(is_rank_program, ([], ["--help"], ["--version"], ["server"], ["nope"])))


def test_each_subcommand_module_has_a_main():
    for name, sub in SUBCOMMANDS.items():
        spec = importlib.util.find_spec(sub.module)
        assert spec and spec.origin, f"{name}: {sub.module} is missing"
        tree = ast.parse(Path(spec.origin).read_text())
        assert any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body), name
        assert name == name.lower() and "_" not in name  # subcommands read as words joined by -


def test_a_job_whose_output_reader_ends_stops_in_one_paragraph(tmp_path):
    """`python -m mpi_train ... | head -1`: the job stops at its next line, saying why, not with a traceback."""
    job = subprocess.Popen([sys.executable, "-m", "mpi_train", "--dataset", "synthetic", "--synthetic-size", "2048",
                            "--batch-size", "64", "--epochs", "20", "--log-every", "1", "--no-tracking"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert job.stdout.readline().startswith("mpi_train: 1 rank(s)")
    job.stdout.close()  # as head does once it has its line
    said = " ".join(job.stderr.read().split())
    assert job.wait(60) == 2 and "Traceback" not in said, said
    assert "its standard output takes no more lines (the program reading it ended, as `| head` does)" in said
