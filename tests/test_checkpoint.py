"""Checkpoint and resume: atomic writes, clear refusals, and exact continuation for every sync method."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import losses, mpirun, train
from rank_programs.resume_check import CHECKED
from torch import nn

from mpi_train.checkpoint import (
    Checkpointer,
    Position,
    check_compatible,
    checkpoint_name,
    checkpoint_payload,
    list_checkpoints,
    load_for_resume,
    optimizer_of,
    read_checkpoint,
    save_atomically,
    write_checkpoint,
)
from mpi_train.cluster import Cluster
from mpi_train.config import TrainConfig
from mpi_train.errors import UserError
from mpi_train.files import CLAIM_FILE, partial_name, write_atomically
from mpi_train.loop.job import changed_course
from mpi_train.optimizers import OPTIMIZERS

# 256 samples at a global batch of 64: 4 steps an epoch. The MNIST CNN has dropout, so each
# rank's random state matters; the resume point (step 6) is in the middle of epoch 2.
ARGS = ["--dataset", "synthetic", "--synthetic-size", "256", "--batch-size", "64", "--epochs", "3",
        "--log-every", "1", "--no-tracking"]
TOTAL, RESUME_AT = 10, 6


@pytest.fixture(scope="module")
def all_runs(tmp_path_factory):
    """Per sync method at np 2: an uninterrupted run, a run stopped at step 6 with checkpoints, its resumption."""
    tmp = tmp_path_factory.mktemp("resume")
    result = mpirun(2, [str(tmp), str(TOTAL), str(RESUME_AT), *ARGS], module="tests.rank_programs.resume_check")
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
    # no temporary file left behind; the folder's claim stays, its lock gone with the job
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == [CLAIM_FILE]
    payload = read_checkpoint(folder / "step-00000006.pt")
    assert (payload["step"], payload["epoch"], payload["step_in_epoch"], payload["world_size"]) == (6, 2, 2, 2)
    assert len(payload["ranks"]) == 2 and payload["mlflow_parent_run_id"] is None
    assert payload["optimizer"] == "sgd"  # the model's default, as the job resolved it
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
    # a rank's state cut out by hand: that rank would start afresh and the replicas part
    cut = {**stepped_payload(5), "world_size": 2}
    write_checkpoint(cut, tmp_path, 5)
    with pytest.raises(UserError, match=r"written by 2 ranks but holds the state of 1: it was changed after it was "
                                        r"written\. No other checkpoint in .* is intact"):
        read_checkpoint(tmp_path / "step-00000005.pt")
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


# ---------------------------------------------------------------------------------------------
# Unit tests on real checkpoint files: a one-rank cluster (MPI as a singleton), real torch.save'd payloads.

SMALL = {"dataset": "synthetic", "synthetic_size": 256, "batch_size": 64}  # the mnist_cnn, which steps with SGD


@pytest.fixture(scope="module")
def one_rank():
    return Cluster.from_mpi()


def stepped_payload(step: int, precision: str | None = None, **flags) -> dict:
    """A checkpoint's payload as a job with `flags` writes it, with the state of its optimizer after one real step."""
    config = TrainConfig(**SMALL, **flags)
    settings = config.optimizer_settings
    model = nn.Linear(4, 2)
    optimizer = OPTIMIZERS[settings.optimizer].build(model.parameters(), settings)
    model(torch.ones(3, 4)).square().sum().backward()
    optimizer.step()
    return checkpoint_payload(config, 1, Position(1, step, step), model.state_dict(), optimizer.state_dict(), [{}],
                              None, precision=precision)


def written(folder, step: int, precision: str | None = None, **flags):
    path = folder / checkpoint_name(step)
    save_atomically(stepped_payload(step, precision, **flags), path)
    return path


def refusal(payload: dict, path, **flags) -> str:
    with pytest.raises(UserError) as caught:
        check_compatible(payload, path, TrainConfig(**SMALL, **flags), world_size=1, total_steps=20)
    return " ".join(str(caught.value).split())


def test_a_checkpoint_of_another_shape_is_refused_naming_both_shapes_and_the_flags_that_give_its(tmp_path):
    gpt = {"model": "gpt", "gpt_size": "tiny"}
    path = written(tmp_path, 3, **gpt)
    payload = read_checkpoint(path)
    assert payload["model_shape"] == {"sample": [128], "layers": 4, "heads": 4, "width": 128}
    check_compatible(payload, path, TrainConfig(**SMALL, **gpt, gpt_width=128), world_size=1, total_steps=20)
    message = refusal(payload, path, **gpt, gpt_width=64)
    assert ("shape 4 layers, 4 heads, width 128, context 128, but this job has shape 4 layers, 4 heads, width 64, "
            "context 128" in message)
    assert "Relaunch with --gpt-layers 4 --gpt-heads 4 --gpt-width 128 --context 128, or drop --resume" in message


def test_weights_that_do_not_fit_the_model_are_refused_in_one_paragraph(tmp_path):
    # a user's model built with other settings, or a checkpoint that kept no shape: its tensors tell
    path = written(tmp_path, 3)
    payload = read_checkpoint(path)
    del payload["model_shape"]
    shapes = {"weight": (3, 4), "bias": (3,), "scale": ()}
    with pytest.raises(UserError) as caught:
        check_compatible(payload, path, TrainConfig(**SMALL), world_size=1, total_steps=20, shapes=shapes)
    message = " ".join(str(caught.value).split())
    assert (f"--resume {path} holds step 3 of a mnist_cnn whose weights do not fit this job's: 2 of its 2 tensors "
            "differ in shape (weight: 2x4 there, 3x4 here; bias: 2 there, 3 here), and this model has 1 tensor(s) it "
            "lacks (scale). A checkpoint continues only the model that wrote it." in message)
    check_compatible(payload, path, TrainConfig(**SMALL), world_size=1, total_steps=20,
                     shapes={"weight": (2, 4), "bias": (2,)})


def test_a_checkpoint_of_another_optimizer_is_refused_naming_both_and_the_fix(tmp_path):
    path = written(tmp_path, 3, optimizer="adamw")
    payload = read_checkpoint(path)
    assert payload["optimizer"] == "adamw"
    check_compatible(payload, path, TrainConfig(**SMALL, optimizer="adamw"), world_size=1, total_steps=20)
    message = refusal(payload, path)  # no --optimizer: the model's default, SGD
    assert "optimizer adamw, but this job has optimizer sgd (the default for mnist_cnn)" in message
    assert "Relaunch with --optimizer adamw, or drop --resume" in message
    assert "model" not in message.split("A checkpoint")[0]  # only what differs is named


@pytest.mark.parametrize("flags, optimizer", [({}, "sgd"), ({"momentum": 0.0}, "sgd"), ({"optimizer": "adamw"},
                                                                                          "adamw")])
def test_a_checkpoint_that_does_not_name_its_optimizer_is_told_by_its_state(tmp_path, flags, optimizer):
    """Checkpoints written before they named their optimizer: SGD's momentum buffers or AdamW's moments tell, and
    SGD without momentum, which keeps no state, by its parameter groups' settings."""
    payload = stepped_payload(3, **flags)
    del payload["optimizer"]
    path = tmp_path / checkpoint_name(3)
    save_atomically(payload, path)
    payload = read_checkpoint(path)
    assert optimizer_of(payload) == optimizer
    other = "sgd" if optimizer == "adamw" else "adamw"
    message = refusal(payload, path, optimizer=other, momentum=None)
    assert f"optimizer {optimizer}, but this job has optimizer {other}" in message
    assert f"--optimizer {optimizer}" in message


def test_a_full_disk_is_one_message_naming_the_file_and_keeps_the_previous_checkpoint(small_disk, one_rank):
    checkpointer = Checkpointer(TrainConfig(**SMALL, checkpoint_dir=str(small_disk)), one_rank)
    checkpointer.write(stepped_payload(1), 1)
    before = (small_disk / checkpoint_name(1)).read_bytes()
    # torch.save raises its own RuntimeError for the full disk, chained from the system's OSError
    with pytest.raises(UserError) as caught:
        checkpointer.write({**stepped_payload(2), "filler": torch.zeros(100_000)}, 2)
    message = " ".join(str(caught.value).split())
    assert f"writing {small_disk / checkpoint_name(2)} failed (No space left on device)" in message
    assert f"the previous checkpoints in {small_disk} are intact. Free space or choose another" in message
    assert sorted(p.name for p in small_disk.iterdir()) == [checkpoint_name(1)]  # no .partial left behind
    assert (small_disk / checkpoint_name(1)).read_bytes() == before and read_checkpoint(small_disk / checkpoint_name(1))
    with pytest.raises(Exception) as bug:  # a failure with no system error behind it is a bug: raised as it is
        write_checkpoint({"broken": lambda: 0}, small_disk, 3)
    assert not isinstance(bug.value, UserError)


def test_a_folder_that_refuses_writing_is_named_with_its_own_fix(tmp_path):
    """Not a full disk: the fix is the folder's (here a file stands where the folder should be)."""
    (tmp_path / "ck").write_text("a file where the folder should be")
    message = " ".join(write_checkpoint(stepped_payload(1), tmp_path / "ck", 1).split())
    assert f"writing {tmp_path / 'ck' / checkpoint_name(1)} failed (File exists); " in message
    assert f"Make {tmp_path / 'ck'} writable or choose another --checkpoint-dir" in message


def test_a_refused_rename_leaves_the_target_and_no_temporary_file(tmp_path):
    """write_atomically's last steps: a rename that fails (here: over a folder) removes the temporary file and raises
    the system's error."""
    target = tmp_path / "step-00000001.pt"
    target.mkdir()
    (target / "kept").write_text("kept")
    with pytest.raises(OSError):
        write_atomically(target, lambda handle: handle.write(b"checkpoint"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name] and (target / "kept").read_text() == "kept"


def damage(path, how: str) -> None:
    """Cut a real checkpoint short, or overwrite bytes in the middle of its tensors (which torch.load alone reads
    as values)."""
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[:len(data) // 2]
    else:
        middle = len(data) // 2
        data[middle:middle + 16] = bytes(16)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "overwritten"])
def test_a_damaged_checkpoint_named_by_resume_is_refused_naming_the_newest_intact_one(tmp_path, how):
    intact = written(tmp_path, 3)
    written(tmp_path, 1)
    broken = tmp_path / checkpoint_name(6)
    save_atomically({**stepped_payload(6), "filler": torch.arange(10_000.0)}, broken)  # tensors fill its middle
    damage(broken, how)
    with pytest.raises(UserError) as caught:
        read_checkpoint(broken)
    message = " ".join(str(caught.value).split())
    assert f"--resume {broken} could not be read as a checkpoint" in message
    assert ("does not match its checksum" if how == "overwritten" else "cut short") in message
    assert f"The newest intact checkpoint in {tmp_path} is {intact} (step 3)" in message
    assert f"relaunch with --resume {intact} to continue from it" in message
    assert broken.exists()  # a checkpoint a person named is left as it is


def test_resume_auto_goes_on_from_the_newest_intact_checkpoint_and_sets_the_damaged_aside(tmp_path, one_rank, capsys):
    for step in (3, 6):
        written(tmp_path, step)
    newest = written(tmp_path, 9)
    damage(newest, "truncated")
    config = TrainConfig(**SMALL, checkpoint_dir=str(tmp_path), resume="auto")
    resume = load_for_resume(config, one_rank, total_steps=20)
    assert resume.path == tmp_path / checkpoint_name(6) and resume.position.step == 6
    line = " ".join(capsys.readouterr().out.split())
    assert f"{newest} (cut short, or not a file torch.save wrote) is damaged (set aside as step-00000009.pt.damaged)" \
        in line
    assert f"resuming from {resume.path} (step 6), so steps 7 to 9 are trained again" in line
    assert [p.name for p in list_checkpoints(tmp_path)] == [checkpoint_name(3), checkpoint_name(6)]
    assert (tmp_path / "step-00000009.pt.damaged").is_file()  # kept for a look, never picked again


def test_resume_auto_with_every_checkpoint_damaged_says_how_to_start_afresh(tmp_path, one_rank):
    for step in (3, 6):
        damage(written(tmp_path, step), "truncated")
    config = TrainConfig(**SMALL, checkpoint_dir=str(tmp_path), resume="auto")
    with pytest.raises(UserError) as caught:
        load_for_resume(config, one_rank, total_steps=20)
    message = " ".join(str(caught.value).split())
    assert f"every checkpoint in {tmp_path} is damaged" in message and "step-00000003.pt: cut short" in message
    assert f"move them out of {tmp_path}" in message and "starts from step 0" in message
    assert [p.name for p in list_checkpoints(tmp_path)] == [checkpoint_name(3), checkpoint_name(6)]  # left as they are


def test_reshard_onto_ranks_the_checkpoints_batch_does_not_split_names_rank_counts_that_do():
    """Under --reshard the global batch stays the checkpoint's: asking for another batch at 3 ranks is answered
    with the checkpoint's batch on rank counts that split it, which the resumed job's checks then accept."""
    payload = {"model": "mnist_cnn", "world_size": 2, "batch_size": 256, "dataset": "synthetic", "train_size": 1024,
               "step": 3}
    job = {"dataset": "synthetic", "synthetic_size": 1024, "resume": "ck/step-00000003.pt", "reshard": True}
    with pytest.raises(UserError) as caught:
        check_compatible(payload, "ck/step-00000003.pt", TrainConfig(**job, batch_size=255), 3, total_steps=5)
    message = " ".join(str(caught.value).split())
    assert "--batch-size 256 on 2 or 4 ranks (mpirun -np 2 or -np 4)" in message
    assert "drop --resume and --reshard" in message
    for world_size in (2, 4):
        TrainConfig(**job, batch_size=256).validate(world_size)
        check_compatible(payload, "ck/step-00000003.pt", TrainConfig(**job, batch_size=256), world_size, 5)


def test_the_next_write_removes_what_a_killed_writer_left_but_not_a_running_one(tmp_path):
    target = tmp_path / "cache.pt"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / partial_name(target.name, dead.pid)  # killed mid-write: nothing removed it
    writing = tmp_path / partial_name(target.name, os.getppid())  # a write still under way, by a running process
    other = tmp_path / f".{target.name}.another-host-{dead.pid}.partial"  # a shared folder: another host's
    for path in (left, writing, other):
        path.write_bytes(b"half")
    write_atomically(target, lambda handle: handle.write(b"whole"))
    assert target.read_bytes() == b"whole" and not left.exists() and writing.exists() and other.exists()


def test_a_job_started_afresh_on_a_folder_of_checkpoints_warns_that_they_would_mix(tmp_path, one_rank, capsys):
    config = TrainConfig(**SMALL, checkpoint_dir=str(tmp_path))
    assert load_for_resume(config, one_rank, total_steps=20) is None and not capsys.readouterr().err  # empty: no word
    written(tmp_path, 4)
    assert load_for_resume(config, one_rank, total_steps=20) is None
    said = " ".join(capsys.readouterr().err.split())
    assert said.startswith(f"mpi_train: warning: --checkpoint-dir {tmp_path} holds 1 checkpoint(s) this job did not "
                           f"write (the newest step-00000004.pt), and it starts afresh")


def test_a_job_resumed_at_another_precision_seed_or_method_is_told_what_it_changed(tmp_path, one_rank):
    path = written(tmp_path, 4, "bf16-mixed", seed=7, sync="ring")
    config = TrainConfig(**SMALL, resume=str(path))
    said = " ".join(changed_course(load_for_resume(config, one_rank, total_steps=20), config, "32-true").split())
    assert said.startswith(f"this job goes on from step 4 of {path} with --precision 32-true (it ran bf16-mixed), "
                           f"--seed 42 (it ran 7: the rest of this epoch is drawn in another order"), said
    assert "--sync allreduce (it ran ring)" in said
    assert said.endswith("Relaunch with --precision bf16-mixed --seed 7 --sync ring to continue that job exactly.")
    same = TrainConfig(**SMALL, resume=str(path), seed=7, sync="ring")
    assert changed_course(load_for_resume(same, one_rank, total_steps=20), same, "bf16-mixed") is None
    older = written(tmp_path, 5, compression="fp16")  # kept no precision: only what it kept is compared
    config = TrainConfig(**SMALL, resume=str(older))
    said = changed_course(load_for_resume(config, one_rank, total_steps=20), config, "32-true")
    assert "--precision" not in said and said.endswith("Relaunch with --sync allreduce --compression fp16 to continue "
                                                       "that job exactly."), said
