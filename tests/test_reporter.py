"""The job's outputs, checked before its first step on real folders and files, in one process (one rank)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mpi_train.cluster import Cluster
from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.files import CLAIM_FILE, LOCAL_FILE_SYSTEMS, claim_folder, file_system, release_claims
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


def test_writable_outputs_pass_and_only_the_claimed_checkpoint_folder_is_made_until_the_job_ends(tmp_path, cluster,
                                                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_outputs(TrainConfig(summary_json=str(tmp_path / "new" / "summary.json"), timeline=True,
                              timeline_dir=str(tmp_path / "timelines"), checkpoint_dir=str(tmp_path / "runs/ck"),
                              tracking_uri="http://127.0.0.1:5000"), cluster)
    assert [path.name for path in tmp_path.iterdir()] == ["runs"]
    assert [path.name for path in (tmp_path / "runs/ck").iterdir()] == [CLAIM_FILE]
    release_claims()
    assert list(tmp_path.iterdir()) == []  # a job refused later leaves no empty folder behind


def test_a_checkpoint_folder_another_job_holds_is_refused_naming_it_and_taken_once_it_has_ended(tmp_path, cluster):
    """The other job is another process holding the folder, as a second launch of the same command meets it; once
    that process has died (killed: no release of its own), the folder is free."""
    folder = tmp_path / "ck"
    holds = (f"import sys; from pathlib import Path; from mpi_train.files import claim_folder; "
             f"print(claim_folder(Path({str(folder)!r})), flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", holds], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "None"
        message = refusal(TrainConfig(checkpoint_dir=str(folder), no_tracking=True), cluster)
        assert f"--checkpoint-dir {folder} is in use by another job (process {holder.pid} on host " in message
        assert "a --checkpoint-dir of its own" in message and "Nothing was trained" in message
    finally:
        holder.kill()
        holder.wait()
    check_outputs(TrainConfig(checkpoint_dir=str(folder), no_tracking=True), cluster)
    release_claims()
    assert (folder / CLAIM_FILE).exists()  # the folder was there before this job: it stays


def test_only_a_local_file_system_is_claimed_where_its_locks_die_with_their_process(tmp_path):
    assert file_system(tmp_path) in LOCAL_FILE_SYSTEMS and file_system(Path("/proc/self")) == "proc"
    elsewhere = Path("/proc/mpi_train-checkpoints")  # as a network file system: no claim, nothing made
    assert claim_folder(elsewhere) is None and not elsewhere.exists()
