"""Checkpoint and resume: atomic writes, clear refusals, and exact continuation for every sync method."""

import json

import pytest
import torch
from conftest import losses, mpirun, train
from resume_check import CHECKED

from mpi_train.checkpoint import (
    check_compatible,
    checkpoint_name,
    list_checkpoints,
    read_checkpoint,
    save_atomically,
)
from mpi_train.config import TrainConfig
from mpi_train.errors import UserError

# 256 samples at a global batch of 64: 4 steps an epoch. The MNIST CNN has dropout, so each
# rank's random state matters; the resume point (step 6) is in the middle of epoch 2.
ARGS = ["--dataset", "synthetic", "--synthetic-size", "256", "--batch-size", "64", "--epochs", "3",
        "--log-every", "1", "--no-tracking"]
TOTAL, RESUME_AT = 10, 6


@pytest.fixture(scope="module")
def all_runs(tmp_path_factory):
    """Per sync method at np 2: an uninterrupted run, a run stopped at step 6 with checkpoints, its resumption."""
    tmp = tmp_path_factory.mktemp("resume")
    result = mpirun(2, [str(tmp), str(TOTAL), str(RESUME_AT), *ARGS], module="tests.resume_check")
    assert result.returncode == 0, result.stdout + result.stderr
    return {sync: {"tmp": tmp, "ck": tmp / f"{sync}-ck",
                   **{job: json.loads((tmp / f"{sync}-{job}.json").read_text())
                      for job in ("whole", "first", "resumed")}}
            for sync in CHECKED}


@pytest.fixture(params=CHECKED)
def three_runs(request, all_runs):
    return {"sync": request.param, **all_runs[request.param]}


@pytest.mark.e2e
def test_resumed_losses_equal_the_uninterrupted_run_at_every_logged_step(three_runs):
    whole = {s["step"]: s["loss"] for s in three_runs["whole"]["steps"]}
    first = [(s["step"], s["loss"]) for s in three_runs["first"]["steps"]]
    resumed = [(s["step"], s["loss"]) for s in three_runs["resumed"]["steps"]]
    assert [step for step, _ in resumed] == list(range(RESUME_AT + 1, TOTAL + 1))
    assert first == [(step, whole[step]) for step in range(1, RESUME_AT + 1)]  # checkpointing changes nothing
    # Exact equality: the same operations run in the same order on the same number of threads, and a
    # two-rank sum does not depend on the order of its terms, so nothing is left to round differently.
    assert resumed == [(step, whole[step]) for step in range(RESUME_AT + 1, TOTAL + 1)]
    assert whole[TOTAL] != whole[RESUME_AT + 1]  # training moved on: equal curves are not equal constants


@pytest.mark.e2e
def test_a_fresh_job_resumes_exactly_too(all_runs, tmp_path):
    """The in-process resumptions above share their processes with earlier jobs; this one starts from nothing."""
    runs = all_runs["ddp"]
    at_resume = runs["ck"] / checkpoint_name(RESUME_AT)
    resumed = train(2, tmp_path, *ARGS, "--sync", "ddp", "--max-steps", str(TOTAL), "--resume", str(at_resume))
    assert ([(s["step"], s["loss"]) for s in resumed["steps"]]
            == [(s["step"], s["loss"]) for s in runs["whole"]["steps"][RESUME_AT:]])


@pytest.mark.e2e
def test_the_resumed_job_evaluates_like_the_uninterrupted_one(three_runs):
    assert [(e["epoch"], e["test_loss"], e["test_accuracy"]) for e in three_runs["resumed"]["epochs"]] == \
        [(e["epoch"], e["test_loss"], e["test_accuracy"]) for e in three_runs["whole"]["epochs"][1:]]


@pytest.mark.e2e
def test_checkpoints_are_written_by_one_rank_atomically_and_pruned(three_runs):
    folder = three_runs["ck"]
    # the first job's, and the resumed job's own at its end (both --resume auto, the first a fresh start)
    assert [p.name for p in list_checkpoints(folder)] == ["step-00000003.pt", "step-00000006.pt", "step-00000010.pt"]
    assert "resumed_from" not in three_runs["first"]
    assert not (three_runs["tmp"] / f"{three_runs['sync']}-again.json").exists()  # relaunched at its end: no job
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left behind
    payload = read_checkpoint(folder / "step-00000006.pt")
    assert (payload["step"], payload["epoch"], payload["step_in_epoch"], payload["world_size"]) == (6, 2, 2, 2)
    assert len(payload["ranks"]) == 2 and payload["mlflow_parent_run_id"] is None
    assert three_runs["resumed"]["resumed_from"]["step"] == RESUME_AT


def test_a_crash_while_writing_leaves_the_last_good_checkpoint(tmp_path):
    good = tmp_path / "step-00000001.pt"
    save_atomically({"format": 1, "weights": torch.arange(4.0)}, good)
    before = good.read_bytes()
    # a lambda cannot be pickled: torch.save fails after writing part of the file
    with pytest.raises(Exception):  # noqa: B017 - any failure of the write will do (its type is the pickler's choice)
        save_atomically({"format": 1, "weights": torch.zeros(1000), "broken": lambda: 0}, tmp_path / "step-00000002.pt")
    assert good.read_bytes() == before
    assert list_checkpoints(tmp_path) == [good] and sorted(p.name for p in tmp_path.iterdir()) == [good.name]


@pytest.mark.e2e
def test_a_checkpoint_of_another_model_is_refused_with_the_fix(all_runs):
    path = all_runs["allreduce"]["ck"] / "step-00000006.pt"
    payload = read_checkpoint(path)
    config = TrainConfig(dataset="synthetic", synthetic_size=256, batch_size=64, model="vgg11")
    with pytest.raises(UserError) as caught:
        check_compatible(payload, path, config, world_size=2, total_steps=TOTAL)
    message = " ".join(str(caught.value).split())
    assert "model mnist_cnn" in message and "model vgg11" in message and "--model mnist_cnn" in message
    assert "ranks" not in message.split("A checkpoint")[0]  # only what differs is named


@pytest.mark.e2e
def test_a_checkpoint_of_another_world_size_is_a_clear_error(all_runs):
    ck = all_runs["allreduce"]["ck"]
    result = mpirun(1, [*ARGS, "--max-steps", str(TOTAL), "--resume", str(ck)])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert "ranks 2" in message and "ranks 1" in message and "mpirun -np 2" in message
    assert "--reshard continues it on another number of ranks" in message
    assert "loss" not in result.stdout  # refused before training


@pytest.mark.e2e
def test_reshard_continues_on_fewer_ranks_training_the_same_samples_each_step(tmp_path):
    """A host gone for good: --reshard resumes 2 ranks' checkpoint on 1 with the global batch kept. Without dropout
    (whose draws belong to a rank) the losses are the uninterrupted job's, but for the order of a sum. With zero,
    whose momentum each rank holds only half of at 2 ranks: the checkpoint holds it whole, and 1 rank takes it all."""
    job = [*ARGS, "--max-steps", "8", "--dropout", "0", "--checkpoint-dir", str(tmp_path / "ck"),
           "--checkpoint-every", "4", "--lr-schedule", "constant", "--sync", "zero"]
    whole = train(2, tmp_path, *job, name="whole")
    resumed = train(1, tmp_path, *job, "--checkpoint-dir", str(tmp_path / "ck2"), "--resume",
                    str(tmp_path / "ck" / "step-00000004.pt"), "--reshard", name="resharded")
    assert resumed["world_size"] == 1 and resumed["batch_size_per_rank"] == 64
    assert resumed["resumed_from"]["world_size"] == 2 and resumed["resumed_from"]["step"] == 4
    assert [s["step"] for s in resumed["steps"]] == [5, 6, 7, 8]
    assert losses(resumed) == pytest.approx(losses(whole)[4:], rel=1e-5)


def test_damaged_or_missing_checkpoints_are_refused(tmp_path):
    broken = tmp_path / "step-00000004.pt"
    broken.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="could not be read as a checkpoint"):
        read_checkpoint(broken)
    from mpi_train.checkpoint import find_checkpoint

    with pytest.raises(UserError, match="no such file or folder"):
        find_checkpoint(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no checkpoint"):
        find_checkpoint(str(tmp_path / "empty"))


def test_checkpoint_every_needs_a_folder():
    with pytest.raises(UserError, match="needs --checkpoint-dir"):
        TrainConfig(checkpoint_every=5).validate(world_size=1)


def test_resume_auto_needs_a_folder_and_reads_its_latest_checkpoint(tmp_path):
    from mpi_train.checkpoint import find_checkpoint

    with pytest.raises(UserError, match="--resume auto .* --checkpoint-dir"):
        TrainConfig(resume="auto").validate(world_size=1)
    assert find_checkpoint("auto", str(tmp_path / "not-yet")) is None  # nothing yet: a fresh start
    for step in (3, 12):
        save_atomically({"step": step}, tmp_path / f"step-{step:08d}.pt")
    (tmp_path / ".step-00000015.pt.partial").write_bytes(b"half")  # a write cut short is never taken
    assert find_checkpoint("auto", str(tmp_path)) == tmp_path / "step-00000012.pt"
