"""--accumulate K: K micro-batches per optimizer step, the sync once after the last, equal one batch of the same
global size to float32 precision for every lossless method (DDP and zero_torch through no_sync(), bucketed and zero by
holding their hooks, fsdp through set_requires_gradient_sync).

The np 2 list of jobs also carries the step's precision and clipping end to end (one mpirun for both; tests/step/
has their units): under bf16-mixed every lossless method equals allreduce; with --clip-grad-norm clipping every step,
zero and fsdp (norms from shards) and bucketed equal allreduce; under 16-mixed an overflow forced on rank 1 at one
step is skipped on every rank, under allreduce, zero, fsdp and local SGD alike, and a resume right after it scales
as the uninterrupted job does; and a model with BatchNorm under --sync-bn trains alike under allreduce, DDP and FSDP,
otherwise than with each rank's own BatchNorm statistics."""

import pytest
from conftest import losses, train_several

from mpi_train.config import TrainConfig
from mpi_train.data.sampler import ResumableSampler
from mpi_train.errors import UserError
from mpi_train.failpoints import OVERFLOW_ENV
from mpi_train.loop.job import no_step_error


def job(synthetic_size: int = 2052, batch_size: int = 64) -> list[str]:
    """The MNIST CNN without dropout and without BatchNorm: nothing in a step depends on how the batch is split."""
    return ["--dataset", "synthetic", "--synthetic-size", str(synthetic_size), "--batch-size", str(batch_size),
            "--max-steps", "4", "--log-every", "1", "--dropout", "0", "--no-tracking"]


# 2052 images: a test set of 513, which rank 0 of 2 scores in two batches of 256 and rank 1 in one, as fsdp's forwards
# (collective all-gathers) must run in step: ranks of uneven shards once waited on each other until --timeout
JOB = job()
FLOAT16_JOB = job(32, 8)  # float16 convolutions run 10x slower than bfloat16 on a CPU without float16 units
LOSSLESS = ("gather_scatter", "allreduce", "flat", "bucketed", "ring", "hierarchical", "ddp", "zero", "fsdp",
            "zero_torch")
CLIPPED = ("allreduce", "zero", "fsdp", "bucketed")  # zero's and fsdp's norms are their shards' (one all-reduce)
OVERFLOWED = ("allreduce", "zero", "fsdp", "localsgd")  # the inf lands in one rank's shard, or one rank's own model
OVERFLOW_STEP = 2  # rank 1's float16 gradients overflow here (MPI_TRAIN_OVERFLOW_AT); a checkpoint right after it
# BatchNorm over the global batch through each kind of wrapper: our hooks, torch's DDP, FSDP2's shards
SYNC_BN_JOB = [*job(), "--model", "tests.user_model:build_batchnorm"]
SYNC_BN = ("allreduce", "ddp", "fsdp")


def relative_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == 4
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def step_jobs(checkpoints) -> dict[str, list[str]]:
    """bf16-mixed under every lossless method, clipping (0.05: below every step's norm) under four, 16-mixed with the
    forced overflow under four (local SGD averaging every step, which equals allreduce), and a resume of allreduce's
    16-mixed job from its checkpoint at the overflowed step."""
    bf16 = {f"{method}-bf16": [*JOB, "--sync", method, "--precision", "bf16-mixed"] for method in LOSSLESS}
    clipped = {f"{method}-clip": [*JOB, "--sync", method, "--clip-grad-norm", "0.05"] for method in CLIPPED}
    fp16 = {f"{method}-16": [*FLOAT16_JOB, "--sync", method, "--precision", "16-mixed",
                             *(("--period", "1") if method == "localsgd" else ())] for method in OVERFLOWED}
    fp16["allreduce-16"] += ["--checkpoint-dir", str(checkpoints), "--checkpoint-every", str(OVERFLOW_STEP)]
    resumed = {"allreduce-16-resumed": [*FLOAT16_JOB, "--sync", "allreduce", "--precision", "16-mixed", "--resume",
                                        str(checkpoints / f"step-{OVERFLOW_STEP:08d}.pt")]}
    sync_bn = {f"{method}-sync-bn": [*SYNC_BN_JOB, "--sync", method, "--sync-bn"] for method in SYNC_BN}
    return {**bf16, **clipped, **fp16, **resumed, **sync_bn, "allreduce-bn": [*SYNC_BN_JOB, "--sync", "allreduce"]}


def check_step_jobs(runs: dict[str, dict]) -> None:
    """What step_jobs' summaries must show (the losses, and the figures logged at every step)."""
    bf16 = losses(runs["allreduce-bf16"])
    assert runs["allreduce-bf16"]["precision"] == "bf16-mixed" and bf16 != losses(runs["whole"])  # it ran in bf16
    for method in LOSSLESS:
        assert relative_gap(losses(runs[f"{method}-bf16"]), bf16) <= 1e-5, f"{method} under bf16-mixed"
    clipped = runs["allreduce-clip"]["steps"]
    assert all(step["grad_norm"] > 0.05 for step in clipped)  # so every step clipped
    assert relative_gap(losses(runs["allreduce-clip"]), losses(runs["whole"])) > 1e-4  # and clipping told
    for method in CLIPPED:
        steps = runs[f"{method}-clip"]["steps"]
        assert relative_gap(losses(runs[f"{method}-clip"]), losses(runs["allreduce-clip"])) <= 1e-5, method
        assert relative_gap([s["grad_norm"] for s in steps], [s["grad_norm"] for s in clipped]) <= 1e-5, method
        scored, reference = runs[f"{method}-clip"]["epochs"][-1], runs["allreduce-clip"]["epochs"][-1]  # uneven shards
        assert scored["test_loss"] == pytest.approx(reference["test_loss"], rel=1e-5), method
        assert scored["test_accuracy"] == pytest.approx(reference["test_accuracy"], abs=1e-9), method
    fp16 = runs["allreduce-16"]["steps"]
    for method in OVERFLOWED:
        steps = runs[f"{method}-16"]["steps"]
        # every rank skipped the overflowed step (a mean over ranks of 1) and halved its scale, none another
        assert [s["skipped_steps"] for s in steps] == [0, 1, 1, 1], method
        assert [s["grad_scale"] for s in steps] == [2.0**16, 2.0**15, 2.0**15, 2.0**15], method
        assert relative_gap(losses(runs[f"{method}-16"]), losses(runs["allreduce-16"])) <= 1e-5, method
    sync_bn = losses(runs["allreduce-sync-bn"])
    for method in SYNC_BN:  # tests/models/test_sync_batchnorm.py: what one process computes on the whole batch
        assert runs[f"{method}-sync-bn"]["config"]["sync_bn"]
        assert relative_gap(losses(runs[f"{method}-sync-bn"]), sync_bn) <= 1e-5, f"{method} --sync-bn"
    assert relative_gap(losses(runs["allreduce-bn"]), sync_bn) > 1e-4  # each rank's own statistics: other losses
    resumed = runs["allreduce-16-resumed"]["steps"]
    assert [s["step"] for s in resumed] == [3, 4]
    assert [(s["loss"], s["grad_scale"], s["skipped_steps"]) for s in resumed] == [
        (s["loss"], s["grad_scale"], s["skipped_steps"]) for s in fp16[2:]]


@pytest.mark.e2e
@pytest.mark.parametrize("np, methods", [(2, LOSSLESS), (4, ("allreduce", "bucketed", "ddp"))])
def test_k_micro_batches_equal_one_batch_of_the_same_global_size(tmp_path, np, methods):
    jobs = {"whole": [*JOB, "--sync", "allreduce"],
            **{f"{method}-k4": [*JOB, "--sync", method, "--accumulate", "4"] for method in methods}}
    if np == 2:
        jobs.update(step_jobs(tmp_path / "checkpoints"))
    runs = train_several(np, tmp_path, jobs, env={OVERFLOW_ENV: f"1:{OVERFLOW_STEP}"} if np == 2 else None)
    whole = losses(runs["whole"])
    for method in methods:
        accumulated = runs[f"{method}-k4"]
        assert accumulated["config"]["accumulate"] == 4 and accumulated["batch_size_per_rank"] == 64 // np
        assert relative_gap(losses(accumulated), whole) <= 1e-5, method
        assert accumulated["mean_times"]["sync_time_s"] >= 0
    if np == 2:
        check_step_jobs(runs)


def test_micro_batches_must_split_each_ranks_share():
    with pytest.raises(UserError, match=r"--accumulate 3 splits each rank's 32 samples.*a multiple of 6"):
        TrainConfig(batch_size=64, accumulate=3).validate(world_size=2)
    with pytest.raises(UserError, match="--accumulate must be positive"):
        TrainConfig(accumulate=0).validate(world_size=1)
    TrainConfig(batch_size=64, accumulate=4).validate(world_size=4)  # 16 a rank, 4 micro-batches of 4


def test_a_pass_too_short_for_one_step_is_one_paragraph_naming_the_split():
    config = TrainConfig(dataset="synthetic", batch_size=8, accumulate=2)
    sampler = ResumableSampler(range(4), num_replicas=2, rank=0, batch_size=config.micro_batch(2))
    assert len(sampler) == 2 and len(sampler) // config.micro_batch(2) // config.accumulate == 0
    assert no_step_error(config, 2, sampler) == (
        "synthetic's training set gives each of 2 rank(s) 2 sample(s) a pass, too few for one step of --batch-size 8 "
        "(4 per rank, in 2 micro-batches of 2): no step could run. Use a smaller --batch-size or --accumulate, fewer "
        "ranks, or more data.")
    single = ResumableSampler(range(2), num_replicas=2, rank=0, batch_size=4)  # one sample a rank: left out
    assert len(single) == 0 and "1 sample(s) a pass (a last batch of one is left out), too few for one step of " \
        "--batch-size 8 (4 per rank)" in no_step_error(TrainConfig(batch_size=8), 2, single)


def test_a_training_set_smaller_than_one_global_batch_is_warned_of():
    from mpi_train.loop.job import samples_per_step, short_set

    assert short_set(30, TrainConfig(batch_size=64), 2) == (
        "the training set holds 30 sample(s), fewer than one global batch of 64: every step trains on all of them (15 "
        "per rank), and samples/s and FLOP/s count those. Give a --batch-size of at most 30, or more data.")
    assert short_set(64, TrainConfig(batch_size=64), 2) is None
    assert short_set(30, TrainConfig(batch_size=64, model="gpt", dataset="text"), 2) is None  # windows: no set size
    # what a step trains on, which samples/s counts: all 30 (padded to split evenly: 31 take 32), or the batch
    sampler = ResumableSampler(range(31), num_replicas=2, rank=0, batch_size=32)
    assert samples_per_step(TrainConfig(batch_size=64), sampler, 2) == 32
    assert samples_per_step(TrainConfig(batch_size=16), sampler, 2) == 16
    assert samples_per_step(TrainConfig(batch_size=64, model="gpt", dataset="text"), None, 2) == 64


def test_a_warm_up_given_that_lasts_the_whole_schedule_is_warned_of():
    from mpi_train.loop.job import long_warmup

    assert long_warmup(TrainConfig(model="mnist_cnn", warmup_steps=16, epochs=1), 16) == (
        "--warmup-steps 16 lasts the whole schedule of 16 step(s) (1 epoch(s) of 16): the rate climbs to --lr 0.1 "
        "until step 16 (the schedule's last: 16), and --lr-schedule cosine never begins. Give fewer warm-up steps, or "
        "more --epochs.")
    assert long_warmup(TrainConfig(warmup_steps=16, epochs=2), 16) is None
    assert long_warmup(TrainConfig(model="mnist_cnn", epochs=1), 16) is None  # its default of 40: a demonstration run


def test_a_host_period_on_one_host_is_warned_of():
    """--host-period on one host changed no loss and said nothing."""
    from mpi_train.loop.job import one_host_level

    config = TrainConfig(sync="localsgd", period=4, host_period=2)
    assert one_host_level(config, ("h", "h")).startswith("--host-period 2 averages inside each host between the "
                                                          "averages over all hosts, and this job's 2 rank(s) share one")
    assert one_host_level(config, ("h1", "h1", "h2", "h2")) is None
    assert one_host_level(TrainConfig(sync="localsgd", period=4), ("h", "h")) is None
