"""The job's outputs, checked before its first step on real folders and files, in one process (one rank)."""

from __future__ import annotations

import pytest

from mpi_train.cluster import Cluster
from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.reporter import check_outputs


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
