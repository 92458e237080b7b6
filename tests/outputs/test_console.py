"""The console's lines from real records, and where the live progress bar is drawn, on a real pseudo-terminal and a
real pipe (a job's own: tests/test_clock.py)."""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import termios

from mpi_train.config import JobInfo
from mpi_train.environments.mpi import MPI_VARIABLES
from mpi_train.environments.torchrun import VARIABLES as TORCHRUN_VARIABLES
from mpi_train.outputs import EPOCH, EPOCH_EVALUATION, EVALUATION, Context, Metrics
from mpi_train.outputs.console import Console, progress_bar
from mpi_train.throughput import Throughput

JOB = JobInfo(world_size=2, backend="gloo", hosts=("h1", "h1"), threads=1, rendezvous="h1:1234",
              batch_size_per_rank=32, steps_per_epoch=4, total_steps=8)
CONFIG = {"sync": "allreduce", "model": "mnist_cnn", "dataset": "synthetic", "precision": "32-true"}


def test_an_epochs_end_is_scored_on_the_epochs_line_and_a_language_model_says_perplexity():
    lines, echoed = [], []
    text = Throughput(flops_per_sample=1e6, device_name="cpu", dtype="fp32", peak_flops=None, tokens_per_sample=16)
    console = Console(Context(config=CONFIG, samples_per_step=64, throughput=text), lines.append, echo=echoed.append)
    console.start(JOB, where=None)
    scores = {"test_loss": 1.0, "test_accuracy": 0.5, "elapsed_s": 3.0, "sent_mb": 1.5}
    console.log(Metrics(kind=EVALUATION, values=scores), 2)
    console.log(Metrics(kind=EPOCH, values={"epoch": 1, "epoch_time_s": 4.0, **scores}), 4)
    console.log(Metrics(kind=EPOCH_EVALUATION, values=scores), 4)
    assert lines[0].startswith("mpi_train: 2 rank(s) on 1 host(s) (h1), backend gloo, sync allreduce, mnist_cnn on "
                               "synthetic, batch 64 (32 per rank), 1 thread(s) per rank, 8 steps")
    assert lines[1:] == [
        ("step 2 validation loss 1.0000  perplexity 2.72  next-byte accuracy 50.00%  after 3.0s of training and 1.5 "
         "MB sent"),
        "epoch 1 validation loss 1.0000  perplexity 2.72  next-byte accuracy 50.00%  (4.0s)"]
    assert echoed == lines  # the tracker's console log holds every line


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


def test_the_opening_lines_say_what_no_step_trains_and_a_resume_that_found_nothing():
    lines = []
    config = {**CONFIG, "sync": "ddp", "model": "my_models:build", "resume": "auto", "checkpoint_dir": "ck"}
    untrained = JobInfo(**{**JOB.__dict__, "untrained_parameters": ("spare.weight", "spare.bias")})
    Console(Context(config=config, samples_per_step=64), lines.append).start(untrained, where=None)
    assert lines[1:] == [
        ("mpi_train: 2 parameter(s) of --model my_models:build get no gradient (spare.weight, spare.bias): no logit "
         "depends on them, so they keep their first values; --sync ddp runs DistributedDataParallel with "
         "find_unused_parameters, which walks the graph at every step to find them."),
        "mpi_train: --resume auto found no checkpoint under ck: the job starts at step 0"]
    lines.clear()
    Console(Context(config={**config, "sync": "allreduce", "resume": None}, samples_per_step=64),
            lines.append).start(untrained, where=None)
    assert lines[1:] == [("mpi_train: 2 parameter(s) of --model my_models:build get no gradient (spare.weight, "
                          "spare.bias): no logit depends on them, so they keep their first values.")]
