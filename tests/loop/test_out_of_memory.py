"""A rank out of memory: told from other errors, and said in one paragraph that names where, the batch and the fix.
The job's own case is a real `mpirun -np 2` job whose model asks for more memory than any machine has."""

import re
import textwrap
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, mpirun

from mpi_train.cluster import RankInfo
from mpi_train.config import TrainConfig
from mpi_train.loop.out_of_memory import paragraph
from mpi_train.memory import host_memory, ran_out, shortfall
from mpi_train.rankguard import guarded

# torch's own words (c10/cuda/CUDACachingAllocator.cpp) for a GPU that ran out: raised on a GPU only
CUDA_SAYS = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.20 "
             "GiB is free. Including non-PyTorch memory, this process has 77.98 GiB memory in use.")


def test_an_allocation_that_fails_is_told_from_other_errors_with_what_it_asked_and_the_room_there_was():
    with pytest.raises(RuntimeError) as cpu:
        torch.empty(2**48, dtype=torch.uint8)  # 256 TiB: more than a process's address space, on any machine
    assert ran_out(cpu.value) and ran_out(MemoryError()) and ran_out(torch.OutOfMemoryError(CUDA_SAYS))
    assert not ran_out(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"))
    assert not ran_out(ValueError("out of memory"))  # only the errors an allocation raises
    free, total = host_memory()
    assert 0 < free <= total
    assert re.fullmatch(r"one allocation asked for 256\.00 TiB, with [\d.]+ [GMT]iB of the host's [\d.]+ [GMT]iB free",
                        shortfall(cpu.value))
    assert shortfall(torch.OutOfMemoryError(CUDA_SAYS)) == ("one allocation asked for 2.00 GiB, with 1.20 GiB of the "
                                                          "GPU's 79.19 GiB free")
    assert shortfall(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)")) == (
        "an allocation failed")


def ranks(world_size: int, step: float) -> SimpleNamespace:
    """What the paragraph reads of a cluster: this rank's place, and the step it had reached."""
    return SimpleNamespace(info=RankInfo(rank=1, local_rank=1, world_size=world_size, local_world_size=world_size,
                                         host="h1"), step_reached=step)


def test_the_paragraph_says_where_with_what_batch_and_what_to_change():
    gpu = torch.OutOfMemoryError(CUDA_SAYS)
    config = TrainConfig(dataset="synthetic", model="vgg11", batch_size=512, precision="32-true")
    in_step = paragraph(config, ranks(2, 7), gpu)
    assert in_step.startswith("ran out of memory in step 7: one allocation asked for 2.00 GiB, with 1.20 GiB of the "
                              "GPU's 79.19 GiB free. Each rank's forward and backward take 256 images at once (its "
                              "share of the batch of 512) through vgg11")
    assert "--accumulate 2 takes 128 at once; any divisor of 256 will do" in in_step
    assert "--precision bf16-mixed about halves" in in_step
    # VGG-11's 9.2 million float32 parameters, their gradients and SGD's momentum
    assert re.search(r"state take 10[45]\.\d\d MiB per rank; .*--sync fsdp or zero shards them", in_step)
    assert "--loader dataloader" in in_step  # the data set may be on the GPU
    assert "\n" not in in_step

    accumulated = TrainConfig(dataset="synthetic", batch_size=96, accumulate=2, precision="bf16-mixed")
    in_pieces = paragraph(accumulated, ranks(2, 3), gpu)
    assert "take 24 images at once (its 48 of the batch of 96 in 2 micro-batches)" in in_pieces
    assert "--accumulate 3 takes 16 at once" in in_pieces and "bf16-mixed about halves" not in in_pieces

    setting_up = paragraph(TrainConfig(dataset="synthetic", batch_size=2, loader="resident"), ranks(2, 0),
                           RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate "
                                        "memory: you tried to allocate 1099511627776 bytes."))
    assert setting_up.startswith("ran out of memory while setting up, before the first step: one allocation asked for "
                                 "1.00 TiB")
    assert "one sample at once already" in setting_up
    assert "--loader dataloader keeps it in the host's memory" in setting_up

    # a model whose own state outgrows the host: no batch mends it (the paragraph once said to lower the batch)
    huge = TrainConfig(dataset="synthetic", model="gpt", gpt_width=65536, gpt_heads=8, gpt_layers=8, batch_size=8)
    model_alone = paragraph(huge, ranks(2, 0), RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried "
                                                            "to allocate 1099511627776 bytes."))
    assert re.search(r"state take [\d.]+ TiB, more than the [\d.]+ GiB this host holds in all: no batch size fits",
                     model_alone) and "--batch-size" not in model_alone and "--accumulate" not in model_alone

    scoring = paragraph(TrainConfig(dataset="synthetic", batch_size=1024), ranks(1, 4.5), gpu)
    assert scoring.startswith("ran out of memory scoring the test set after step 4: ")
    assert "Scoring takes the larger of that share and 256 per rank at once: lower --batch-size." in scoring
    assert "--accumulate" not in scoring and "--sync fsdp" not in scoring


def test_any_commands_rank_out_of_memory_prints_a_paragraph_not_a_traceback_and_ends_every_rank(capsys):
    aborted = []
    cluster = SimpleNamespace(info=RankInfo(rank=0, local_rank=0, world_size=2, local_world_size=2, host="h0"),
                              abort=aborted.append)  # what ends every rank: the launcher's abort, here noted
    assert guarded(cluster, lambda: torch.empty(2**48, dtype=torch.uint8)) == 1 and aborted == [1]
    said = " ".join(capsys.readouterr().err.split())
    assert re.fullmatch(r"mpi_train: error: rank 0 on h0 ran out of memory: one allocation asked for 256\.00 TiB, with "
                        r".* free\. Stopping every rank: lower --batch-size, or use a smaller model\.", said), said
    guarded(cluster, lambda: torch.empty(2**48, dtype=torch.uint8), memory_fix="lower --size-mb")  # collectives
    assert capsys.readouterr().err.split()[-3:] == ["rank:", "lower", "--size-mb."]


HUGE_ACTIVATIONS = textwrap.dedent("""
    from torch import nn


    def magnified(num_classes, input_shape):
        # each 32-pixel image enlarged 32768 times a side before its first layer: 12 TiB an image
        return nn.Sequential(nn.Upsample(scale_factor=32768), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(input_shape[0], num_classes))
""")


@pytest.mark.e2e
def test_a_batch_too_large_for_memory_is_said_once_by_rank_0_and_ends_every_rank(tmp_path):
    (tmp_path / "huge_models.py").write_text(HUGE_ACTIVATIONS)
    result = mpirun(2, ["--dataset", "synthetic", "--synthetic-size", "128", "--batch-size", "64", "--model",
                        "huge_models:magnified", "--max-steps", "2", "--no-tracking", "--timeout", "60"],
                    env={"PYTHONPATH": f"{tmp_path}:{REPO}"}, cwd=tmp_path)
    said = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "frame #" not in result.stderr
    # every rank ran out in the same step: rank 0's abort ended rank 1 before it said the same again
    assert said.count("ran out of memory") == 1, result.stderr
    assert re.search(r"mpi_train: error: rank 0 on \S+: ran out of memory in step 1: one allocation asked for "
                     r"384\.00 TiB, .* take 32 images at once \(its share of the batch of 64\) through "
                     r"huge_models:magnified, .*--accumulate 2 takes 16 at once\b", said), said
