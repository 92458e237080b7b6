"""Per-rank randomness under real mpirun: replicas start identical, their crops, flips and dropout do not,
and the same seed and world size reproduce every draw, through a rerun and a resume."""

import json

import pytest
from conftest import losses, mpirun, train
from disk_formats import write_cifar10_folders
from rank_programs.methods_run import UNCOMPRESSED

from mpi_train.randomness import rank_seed

pytestmark = pytest.mark.e2e


def rank_views(tmp_path, data, seed: int, name: str) -> list[dict]:
    out = tmp_path / f"{name}.json"
    result = mpirun(2, [str(data), str(out), str(seed)], module="tests.rank_programs.rank_views_check")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def cifar_folders(tmp_path_factory):
    return write_cifar10_folders(tmp_path_factory.mktemp("cifar") / "data", train=64, test=20)


def test_each_rank_has_a_stream_of_its_own():
    assert len({rank_seed(seed, rank) for seed in (1, 2, 42) for rank in range(8)}) == 24


def test_ranks_augment_the_same_image_differently_and_a_rerun_draws_the_same(tmp_path, cifar_folders):
    first = rank_views(tmp_path, cifar_folders, 42, "first")
    zero, one = first
    assert zero["digest"] == one["digest"]  # identical replicas
    assert zero["image"] == one["image"]  # the same training image index on both ranks
    assert zero["views"] != one["views"]  # augmented differently (3 crops and flips each)
    assert zero["resident_views"] != one["resident_views"] and len(set(zero["resident_views"])) > 1  # on both paths
    assert zero["dropout"] != one["dropout"]
    assert rank_views(tmp_path, cifar_folders, 42, "rerun") == first  # bit for bit
    other_seed = rank_views(tmp_path, cifar_folders, 7, "seed7")
    assert other_seed[0]["views"] != zero["views"] and other_seed[0]["digest"] != zero["digest"]
    assert other_seed[0]["resident_views"] != zero["resident_views"]


def test_augmented_training_reruns_and_resumes_bit_for_bit(tmp_path, cifar_folders):
    args = ["--data-dir", str(cifar_folders), "--batch-size", "16", "--epochs", "2", "--log-every", "1",
            "--no-tracking", "--sync", "gather_scatter"]
    whole = train(2, tmp_path, *args, "--max-steps", "6", name="whole")
    again = train(2, tmp_path, *args, "--max-steps", "6", name="again")
    assert losses(whole) == losses(again)
    checkpoints = tmp_path / "ck"
    train(2, tmp_path, *args, "--max-steps", "3", "--checkpoint-dir", str(checkpoints), name="first")
    resumed = train(2, tmp_path, *args, "--max-steps", "6", "--resume", str(checkpoints), name="resumed")
    assert [(s["step"], s["loss"]) for s in resumed["steps"]] == [(s["step"], s["loss"]) for s in whole["steps"][3:]]
    assert [s["lr"] for s in resumed["steps"]] == [s["lr"] for s in whole["steps"][3:]]


def test_the_summary_gives_step_times_with_and_without_warm_up_and_the_rate_of_each_step(tmp_path, quick_args):
    summary = train(2, tmp_path, *quick_args, "--max-steps", "4", "--warmup-steps", "4", "--lr", "0.2",
                    "--timing-warmup-steps", "2")
    assert [s["lr"] for s in summary["steps"]] == pytest.approx([0.1, 0.2])  # logged at steps 2 and 4
    assert summary["timing_warmup_steps"] == 2
    assert summary["mean_times"]["step_time_s"] > 0 and summary["mean_times_after_warmup"]["step_time_s"] > 0
    assert summary["mean_times"] != summary["mean_times_after_warmup"]
    assert summary["config"]["lr"] == 0.2 and summary["config"]["warmup_steps"] == 4


def test_every_uncompressed_sync_method_reruns_bit_for_bit(tmp_path, quick_args):
    # The MNIST CNN's dropout draws from each rank's own stream, so this also checks those streams restart.
    summaries = []
    for attempt in ("first", "second"):
        out = tmp_path / attempt
        out.mkdir()
        result = mpirun(2, [str(out), *quick_args, "--max-steps", "6"], module="tests.rank_programs.methods_run")
        assert result.returncode == 0, result.stdout + result.stderr
        summaries.append({sync: json.loads((out / f"{sync}.json").read_text()) for sync in UNCOMPRESSED})
    first, second = summaries
    assert "gather_scatter" in UNCOMPRESSED and "flat_fp16" not in UNCOMPRESSED
    for sync in UNCOMPRESSED:
        assert len(losses(first[sync])) == 3 and losses(first[sync]) == losses(second[sync]), sync
