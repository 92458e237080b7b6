"""What the bench and the advisor write: checked before they measure, and a file the end cannot keep said once."""

import subprocess
import sys
import textwrap

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from conftest import REPO, client_for, filled, wait_for

from mpi_train.benchmark.job import unkept
from mpi_train.files import kept, unwritable, without_nan, write_figure, write_json_atomically


def test_outputs_that_cannot_be_written_are_named_before_anything_is_made(tmp_path):
    (tmp_path / "afile").write_text("x")
    problems = unwritable([("--json", str(tmp_path / "afile/bench.json"), False),
                           ("--advice-dir", str(tmp_path / "afile"), True),
                           ("--json", None, False),  # not asked for
                           ("--json", str(tmp_path / "new/bench.json"), False)])  # made once measured
    assert f"--json {tmp_path}/afile/bench.json lies under {tmp_path}/afile, which is a file; name a file" in problems
    assert f"--advice-dir {tmp_path}/afile is a file, not a folder; name a folder this user can write." in problems
    assert "new" not in problems and not (tmp_path / "new").exists()
    assert unwritable([("--json", str(tmp_path / "bench.json"), False), ("--advice-dir", str(tmp_path), True)]) is None
    # a name no file can take: once a file named jdir was written, and --plot "" ended in a traceback
    assert unwritable([("--json", "jdir/", False)]) == ("--json jdir/ ends in /, as a folder's name does, not a "
                                                        "file's; name a file in a folder this user can write.")
    assert unwritable([("--plot", "", False)]).startswith("--plot '' names nothing;")


def test_the_bench_json_is_strict_json():
    """A method timed once has no spread: its noise_s was written as NaN, which JSON.parse and jq --strict refuse."""
    import json

    row = {"method": "ddp", "noise_s": float("nan"), "floor_s": float("inf"), "steps": [0.1, float("-inf")]}
    text = json.dumps(without_nan({"methods": [row]}), allow_nan=False)  # raises on any NaN or Infinity left
    assert json.loads(text) == {"methods": [{"method": "ddp", "noise_s": None, "floor_s": None, "steps": [0.1, None]}]}


def test_a_full_disk_at_the_end_keeps_no_half_file_and_says_what_is_missing_once(small_disk, capsys):
    disk = filled(small_disk)
    figure, _ = plt.subplots()
    failures = [kept("--json out.json", lambda: write_json_atomically(str(disk / "out.json"), {"x": [1.0] * 9999})),
                kept("its plot", lambda: write_figure(figure, disk / "plot.png")), None]
    assert failures[:2] == ["--json out.json could not be written (No space left on device)",
                            "its plot could not be written (No space left on device)"]
    assert sorted(path.name for path in disk.iterdir()) == ["filler"] and not plt.get_fignums()
    assert unkept(failures, "The bench measured every method") == 2
    said = " ".join(capsys.readouterr().err.split())
    assert said.startswith("mpi_train: error: The bench measured every method and the lines above hold its figures, "
                           "but --json out.json could not be written (No space left on device); its plot could not")
    assert unkept([None, ""], "The bench measured") == 0 and not capsys.readouterr().err


@pytest.mark.e2e
def test_a_bench_whose_logging_is_cut_short_leaves_no_run_running(mlflow_server):
    """Ctrl-C while the bench's runs are logged ends them KILLED; a rank 0 killed then (mpirun follows its SIGTERM
    with SIGKILL at once) has its guard end them, the child made after the guard started among them."""
    from mpi_train.benchmark.mlflow_runs import log_child, parent_run
    from mpi_train.tracking import Connection

    uri, client = mlflow_server, client_for(mlflow_server)
    experiment = client.create_experiment("tests-bench-cut-short")
    with pytest.raises(KeyboardInterrupt), parent_run(Connection(client, uri, experiment), "interrupted", {}) as (
            run_id, opened):
        log_child(client, experiment, run_id, "measured", "bench_method", {"step_s": 1.0}, {}, 0, opened)
        raise KeyboardInterrupt
    killed = textwrap.dedent(f"""
        import os
        from mpi_train.benchmark.mlflow_runs import parent_run
        from mpi_train.tracking import Connection, mlflow_client
        client = mlflow_client({uri!r})
        with parent_run(Connection(client, {uri!r}, {experiment!r}), "killed", {{}}) as (run_id, opened):
            opened(client.create_run({experiment!r}, run_name="half-logged").info.run_id)
            os._exit(9)  # as SIGKILL: nothing more of this process runs
    """)
    subprocess.run([sys.executable, "-c", killed], cwd=REPO, timeout=120, check=False)

    def ended() -> dict:
        statuses = {run.info.run_name: run.info.status for run in client.search_runs([experiment])}
        return statuses if "RUNNING" not in statuses.values() and len(statuses) == 4 else None

    assert wait_for(ended, 60, "the guard to end the killed runs") == {
        "interrupted": "KILLED", "measured": "KILLED", "killed": "KILLED", "half-logged": "KILLED"}
