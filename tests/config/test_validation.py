"""The checks a job passes before any work starts, each refusal one paragraph naming the values and the fix."""

import re

import pytest

from mpi_train.config import TrainConfig
from mpi_train.errors import UserError, format_error


def test_indivisible_batch_names_values_and_fix():
    with pytest.raises(UserError) as error:
        TrainConfig(batch_size=250).validate(world_size=4)
    message = str(error.value)
    assert "--batch-size 250" in message and "4 ranks" in message and "248" in message and "252" in message


@pytest.mark.parametrize("world_size,accumulate", [(3, 1), (2, 3), (3, 3), (300, 1)])
def test_reshard_advice_for_a_batch_that_does_not_split_is_advice_the_checks_accept(world_size, accumulate):
    """--reshard keeps the checkpoint's global batch: each rank count, --accumulate and fresh --batch-size the
    message suggests passes the same check (a multiple of the ranks alone would be refused at resume)."""
    job = {"dataset": "synthetic", "batch_size": 256, "accumulate": accumulate, "checkpoint_dir": "ck"}
    with pytest.raises(UserError) as error:
        TrainConfig(**job, resume="auto", reshard=True).validate(world_size)
    message = " ".join(str(error.value).split())
    assert "--batch-size 256" in message and "drop --resume and --reshard" in message
    ranks = [int(n) for n in re.findall(r"-np (\d+)", message)]
    assert ranks == {(3, 1): [2, 4], (2, 3): [], (3, 3): [], (300, 1): [256]}[world_size, accumulate]
    for count in ranks:
        TrainConfig(**job, resume="auto", reshard=True).validate(count)
    share = f"an --accumulate that divides each rank's {256 // world_size} samples"
    assert (share in message) == (not 256 % world_size)  # offered where the ranks split it and K does not
    if share in message:
        for k in (k for k in range(1, 257) if not 256 // world_size % k):
            TrainConfig(**{**job, "accumulate": k}, resume="auto", reshard=True).validate(world_size)
    fresh = re.search(r"multiple of \d+ \(e\.g\. (\d+) or (\d+)\) in another --checkpoint-dir", message)
    assert len(set(fresh.groups())) == 2
    for batch_size in map(int, fresh.groups()):
        TrainConfig(**{**job, "batch_size": batch_size, "checkpoint_dir": "ck2"}).validate(world_size)


@pytest.mark.parametrize("field,value", [("batch_size", 0), ("epochs", -1), ("lr", 0.0), ("max_steps", 0),
                                         ("log_every", 0), ("threads", 0), ("synthetic_size", 0), ("timeout", -5.0),
                                         ("momentum", -0.1), ("bucket_mb", 0.0), ("powersgd_rank", 0),
                                         ("powersgd_start_step", -1)])
def test_zero_or_negative_numbers_are_rejected(field, value):
    readers = {"bucket_mb": {"sync": "bucketed"}, "powersgd_rank": {"sync": "bucketed", "compression": "powersgd"},
               "powersgd_start_step": {"sync": "bucketed", "compression": "powersgd"}}  # the jobs that read them
    with pytest.raises(UserError) as error:
        TrainConfig(**readers.get(field, {}), **{field: value}).validate(world_size=1)
    assert str(value) in str(error.value)


@pytest.mark.parametrize("field,value,says", [
    ("lr", float("nan"), "--lr must be a finite number, got nan"), ("lr", float("inf"), "--lr must be a finite"),
    ("momentum", float("nan"), "--momentum must be a finite"), ("momentum", 1.0, "--momentum must be in [0, 1)"),
    ("timeout", float("inf"), "--timeout must be a finite"), ("weight_decay", float("nan"), "--weight-decay must"),
    ("clip_grad_norm", float("nan"), "--clip-grad-norm must be a number, got nan"),
    ("bucket_mb", float("nan"), "--bucket-mb must be a number"), ("seed", -1, "--seed must be in [0, 2**32)"),
    ("seed", 2**32, "--seed must be in [0, 2**32)"),
    ("timeout", 0.001, "--timeout 0.001 is out of range: give from 1 s"), ("timeout", 1e15, "to 1,000,000,000 s")])
def test_numbers_no_run_can_use_are_refused_before_any_work(field, value, says):
    with pytest.raises(UserError) as error:
        TrainConfig(**{field: value}).validate(world_size=1)
    assert says in str(error.value)


@pytest.mark.parametrize("name, says", [("", "and got an empty name"), ("  ", "and got an empty name"),
                                        ("e" * 501, "and got 501 characters")])
def test_an_experiment_name_mlflow_would_refuse_is_refused_before_any_work(name, says):
    with pytest.raises(UserError) as error:
        TrainConfig(experiment=name).validate(world_size=1)
    assert says in str(error.value) and "1 to 500 characters" in str(error.value)
    TrainConfig(experiment=name, no_tracking=True).validate(world_size=1)  # not used: not checked


def test_a_methods_flag_given_to_a_job_that_would_ignore_it_is_refused():
    # each was once run without it and without a word: ddp keeps DistributedDataParallel's own 25 MB buckets
    ddp = "--bucket-mb is read by --sync bucketed and zero only, and this job runs --sync ddp, which would ignore it"
    rank = ("--powersgd-rank is read by --compression powersgd (and --sync ddp_powersgd) only, and this job runs "
            "--sync bucketed, which would ignore it. Drop --powersgd-rank, or add --compression powersgd.")
    fp16 = "this job runs --sync bucketed --compression fp16, which would ignore it"
    for ignored, says in [({"sync": "ddp", "bucket_mb": 1.0}, ddp), ({"sync": "bucketed", "powersgd_rank": 4}, rank),
                          ({"sync": "bucketed", "compression": "fp16", "powersgd_start_step": 5}, fp16)]:
        with pytest.raises(UserError) as error:
            TrainConfig(**ignored).validate(world_size=2)
        assert says in str(error.value)
    for read in ({"sync": "zero", "bucket_mb": 1.0}, {"sync": "ddp_powersgd", "powersgd_rank": 4},
                 {"sync": "bucketed", "compression": "powersgd", "powersgd_start_step": 0}):
        TrainConfig(**read).validate(world_size=2)
    # the job runs (and logs) the defaults where its method reads them, and leaves the others unset
    assert [TrainConfig(sync=sync).as_dict()["bucket_mb"] for sync in ("bucketed", "zero", "ddp")] == [25.0, 25.0, None]
    assert TrainConfig(sync="ddp_powersgd").as_dict()["powersgd_rank"] == 2
    # a folder for a timeline the job never records: once ignored without a word
    with pytest.raises(UserError, match=r"--timeline-dir tl says where the timeline is written, and this job records "
                                        r"none\. Add --timeline"):
        TrainConfig(timeline_dir="tl").validate(world_size=2)
    TrainConfig(timeline_steps="2:3", timeline_dir="tl").validate(world_size=2)
    assert TrainConfig(timeline=True).as_dict()["timeline_dir"] == "timelines"


def test_infinity_where_it_means_something_is_taken():
    TrainConfig(clip_grad_norm=float("inf")).validate(world_size=1)  # the norm logged, nothing clipped
    TrainConfig(sync="bucketed", bucket_mb=float("inf")).validate(world_size=1)  # one bucket
    TrainConfig(seed=2**32 - 1, momentum=0.99).validate(world_size=1)


def test_errors_print_as_one_paragraph():
    text = format_error("x " * 200)
    assert text.startswith("mpi_train: error:") and "\n\n" not in text


@pytest.mark.parametrize("dataset,model", [("cifar10", "mnist_cnn"), ("mnist", "vgg11")])
def test_a_model_that_cannot_take_the_data_sets_images_is_refused(dataset, model):
    with pytest.raises(UserError, match=f"--model {model} takes images of .* and {dataset}'s are"):
        TrainConfig(dataset=dataset, model=model).validate(1)
    TrainConfig(dataset="synthetic", model=model).validate(1)  # synthetic images take the model's shape


def test_the_data_path_flags_are_checked():
    assert TrainConfig().loader == "auto"
    with pytest.raises(UserError, match="--loader-workers must not be negative"):
        TrainConfig(loader="dataloader", loader_workers=-1).validate(1)
    # workers for a DataLoader the job never makes: once ignored without a word
    for ignored in (TrainConfig(model="gpt", dataset="synthetic", loader_workers=4),
                    TrainConfig(dataset="synthetic", loader="resident", loader_workers=4)):
        with pytest.raises(UserError, match="--loader-workers sets the processes torch's DataLoader reads images"):
            ignored.validate(1)
    TrainConfig(dataset="synthetic", loader="dataloader", loader_workers=4).validate(1)
    # a smaller data set asked of mnist: once trained on all 60,000 images without a word
    with pytest.raises(UserError, match="--synthetic-size is how many samples --dataset synthetic makes, and this "
                                        "job reads --dataset mnist, which would ignore it"):
        TrainConfig(dataset="mnist", synthetic_size=512).validate(1)
    assert TrainConfig(dataset="synthetic").synthetic_samples == 4096
    assert TrainConfig(dataset="synthetic").as_dict()["synthetic_size"] == 4096  # the size the run logs
    assert TrainConfig(dataset="mnist").as_dict()["synthetic_size"] is None
