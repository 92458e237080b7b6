"""The job's outputs, checked before its first step on real folders and files, in one process (one rank); where the
live progress bar is drawn, on a real pseudo-terminal and a real pipe (a job's own: tests/test_clock.py)."""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import termios

import pytest

from mpi_train.cluster import Cluster
from mpi_train.config import JobInfo, TrainConfig
from mpi_train.environments.mpi import MPI_VARIABLES
from mpi_train.environments.torchrun import VARIABLES as TORCHRUN_VARIABLES
from mpi_train.errors import UserError
from mpi_train.reporter import check_outputs, progress_bar


@pytest.fixture(scope="module")
def cluster():
    return Cluster.from_mpi()


def refusal(config: TrainConfig, cluster) -> str:
    with pytest.raises(UserError) as caught:
        check_outputs(config, cluster)
    return str(caught.value)


def test_a_folder_given_as_summary_json_is_refused_before_training_with_a_file_in_it_as_the_fix(tmp_path, cluster):
    folder = tmp_path / "results"
    folder.mkdir()
    message = refusal(TrainConfig(summary_json=str(folder), no_tracking=True), cluster)
    assert message.startswith("The job cannot write its outputs: ")
    assert f"--summary-json {folder} is a folder, not a file" in message
    assert f"--summary-json {folder / 'summary.json'}" in message and "Nothing was trained" in message
    assert list(folder.iterdir()) == []


def test_a_file_given_as_timeline_dir_or_above_checkpoint_dir_is_refused_and_both_are_named(tmp_path, cluster):
    taken = tmp_path / "taken"
    taken.write_text("a file where a folder should be")
    config = TrainConfig(timeline=True, timeline_dir=str(taken), checkpoint_dir=str(taken / "ck"), no_tracking=True)
    message = refusal(config, cluster)
    assert f"--timeline-dir {taken} is a file, not a folder" in message
    assert f"--checkpoint-dir {taken / 'ck'} lies under {taken}, which is a file" in message
    assert message.count("name a writable folder") == 2


def test_a_server_job_whose_spool_folder_cannot_be_made_is_refused(tmp_path, cluster, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlruns").write_text("a file where the store folder should be")
    message = refusal(TrainConfig(tracking_uri="http://127.0.0.1:5000"), cluster)
    assert f"the tracking spool folder mlruns/spool lies under {tmp_path / 'mlruns'}, which is a file" in message
    assert "--no-tracking" in message
    check_outputs(TrainConfig(tracking_uri="http://127.0.0.1:5000", no_tracking=True), cluster)  # no spool then


def test_writable_outputs_pass_and_nothing_is_created_before_the_job_writes(tmp_path, cluster, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_outputs(TrainConfig(summary_json=str(tmp_path / "new" / "summary.json"), timeline=True,
                              timeline_dir=str(tmp_path / "timelines"), checkpoint_dir=str(tmp_path / "ck"),
                              tracking_uri="http://127.0.0.1:5000"), cluster)
    assert list(tmp_path.iterdir()) == []  # a job refused later leaves no empty folder behind


def test_the_progress_bar_is_drawn_on_a_terminal_only_and_never_under_a_launcher(monkeypatch):
    """Open MPI's mpirun gives each rank a terminal of its own: a rank's stdout being one says nothing of where a
    person looks, so a launcher's variables rule the bar out."""
    for name in (*MPI_VARIABLES, *TORCHRUN_VARIABLES, "SLURM_PROCID"):  # as run directly, whatever ran pytest
        monkeypatch.delenv(name, raising=False)
    resumed = JobInfo(world_size=1, backend="gloo", hosts=("h1",), threads=1, rendezvous="h1:1234",
                      batch_size_per_rank=64, steps_per_epoch=4, total_steps=12,
                      resumed_from={"checkpoint": "ck/step-00000004.pt", "step": 4, "run_id": None, "world_size": 1})
    reading, writing = os.openpty()
    fcntl.ioctl(writing, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        with open(writing, "w", encoding="utf-8") as terminal:
            monkeypatch.setattr(sys, "stdout", terminal)
            bar = progress_bar(resumed)
            assert bar is not None and (bar.n, bar.total, bar.desc) == (4, 12, "epoch 2")  # resumed at epoch 2's start
            bar.close()
            monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")  # what mpirun sets on every rank
            assert progress_bar(resumed) is None
    finally:
        os.close(reading)
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    reading, writing = os.pipe()
    try:
        with open(writing, "w", encoding="utf-8") as pipe:
            monkeypatch.setattr(sys, "stdout", pipe)
            assert progress_bar(resumed) is None
    finally:
        os.close(reading)
