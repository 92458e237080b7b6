"""The experiment runner end to end: a sweep of real mpirun jobs, one of them failing, then the report."""

import json
import os
import subprocess
import sys

import pytest
from conftest import MPI_ENV, REPO

PNG = b"\x89PNG"


@pytest.mark.e2e
def test_a_sweep_runs_past_a_failed_run_and_ends_with_the_report(tmp_path):
    out = tmp_path / "out"
    path = tmp_path / "sweep.toml"
    path.write_text(f"""
[experiment]
name = "tests-sweep"
tracking = false
out = "{out}"

[launch]
timeout = 200

[train]
dataset = "synthetic"
synthetic_size = 256
batch_size = 32
max_steps = 4
log_every = 2

[[sweep]]                      # rank 1 raises after step 2: the run fails, the sweep goes on
sync = "gather_scatter"
np = 2
env = {{ MPI_TRAIN_FAIL_AT = "1:2" }}

[[sweep]]
sync = "allreduce"
np = 2
seed = [1, 2]
""")
    result = subprocess.run([sys.executable, "-m", "mpi_train", "experiment", str(path)],
                            capture_output=True, text=True, timeout=400,
                            cwd=REPO, env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO)}, check=False)
    output = result.stdout
    assert result.returncode == 1, output + result.stderr
    assert "[1/3] gather_scatter-np2-seed42: FAILED (exit" in output and "injected failure" in output
    for index, name in ((2, "allreduce-np2-seed1"), (3, "allreduce-np2-seed2")):
        assert f"[{index}/3] {name}: step 4/4" in output and f"[{index}/3] {name}: done in" in output
        summary = json.loads((out / "runs" / f"{name}.json").read_text())
        assert summary["total_steps"] == 4 and summary["world_size"] == 2
    assert not (out / "runs" / "gather_scatter-np2-seed42.json").exists()
    assert "left (estimate)" in output

    report = output[output.index("Runs of 'tests-sweep' (2 finished). Times per step: summary/<phase> = the mean over "
                                 "ranks and over the steps after the first --timing-warmup-steps"):]
    rows = [line.split() for line in report.splitlines()[3:5]]
    assert sorted(row[0] for row in rows) == ["allreduce-np2-seed1", "allreduce-np2-seed2"]
    assert all(row[1:3] == ["allreduce", "2"] for row in rows)
    # the speed-up says what it is against, and the rule that withholds a verdict is printed with it
    assert report.splitlines()[1].split()[-1] == "speed-up_vs_slowest" and "Noise: within noise = " in report
    assert (out / "report.txt").read_text().startswith("Runs of 'tests-sweep'")
    for name in ("loss_vs_step.png", "time_breakdown.png", "rank_step_time_spread.png"):
        assert (out / "plots" / name).read_bytes().startswith(PNG)
    assert "2 of 3 run(s) succeeded" in output
    assert ("FAILED [1/3] gather_scatter-np2-seed42 (exit" in output
            and str(out / "logs" / "01-gather_scatter-np2-seed42.log") in output)


def test_the_run_under_way_when_a_sweep_is_interrupted_is_said_stopped_and_those_after_it_not_run(
        tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from mpi_train.lab import experiment
    from mpi_train.lab.sweep_launch import Launch

    def execute(launch, progress, timeout):  # the second run is under way when Ctrl-C comes
        if launch.index == 2:
            raise KeyboardInterrupt
        launch.returncode = 0

    monkeypatch.setattr(experiment, "execute", execute)
    monkeypatch.setattr(experiment, "report", lambda *_: None)
    launches = [Launch(index=i, name=f"run{i}", command=[], steps=4, log=tmp_path / f"{i}.log") for i in (1, 2, 3)]
    assert experiment.run_sweep(SimpleNamespace(network=None, out=tmp_path, timeout=60), launches, None) == 130
    said = capsys.readouterr().out
    assert "1 of 3 run(s) succeeded" in said and "stopped [2/3] run2: interrupted while it ran" in said
    assert "not run [3/3] run3" in said and "not run [2/3]" not in said
