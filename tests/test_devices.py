"""The one decision of backend and device, for hosts with and without GPUs (no GPU needed)."""

import os

import pytest
import torch

from mpi_train.cluster import Cluster, RankInfo
from mpi_train.devices import Decision, RankGpus, configure_threads, decide, resolve_backend
from mpi_train.errors import UserError

FOUR_GPUS = ("GPU-a", "GPU-b", "GPU-c", "GPU-d")


def host(name: str, ranks: int, gpus: tuple[str, ...]) -> list[RankGpus]:
    return [RankGpus(name, local_rank, gpus) for local_rank in range(ranks)]


def test_several_gpus_per_host_give_each_rank_the_gpu_at_its_local_rank():
    ranks = host("n1", 4, FOUR_GPUS) + host("n2", 4, FOUR_GPUS)
    decision = decide("auto", ranks)
    assert decision == Decision("nccl", ("cuda:0", "cuda:1", "cuda:2", "cuda:3") * 2)
    assert decide("nccl", ranks) == decision


def test_one_gpu_per_rank_by_the_launcher_is_cuda_0_everywhere():
    # srun --gpus-per-task=1 or CUDA_VISIBLE_DEVICES per rank: each rank sees only its own GPU
    ranks = [RankGpus("n1", local_rank, (f"GPU-{local_rank}",)) for local_rank in range(4)]
    assert decide("auto", ranks) == Decision("nccl", ("cuda:0",) * 4)


def test_ranks_sharing_one_gpu_fall_back_to_gloo_or_are_refused_under_nccl():
    ranks = host("n1", 2, ("GPU-a",))  # two ranks, one GPU: NCCL refuses duplicate devices
    assert decide("auto", ranks) == Decision("gloo", ("cpu", "cpu"))
    with pytest.raises(UserError, match="ranks 0 and 1 on host n1 would share GPU GPU-a"):
        decide("nccl", ranks)


def test_more_ranks_than_gpus_on_a_host():
    ranks = host("n1", 3, ("GPU-a", "GPU-b"))
    assert decide("auto", ranks).backend == "gloo"
    with pytest.raises(UserError, match=r"rank\(s\) \[2\] \(host n1, local rank 2, 2 GPU\(s\) visible\)"):
        decide("nccl", ranks)


def test_a_host_without_gpus_keeps_the_whole_job_on_gloo():
    ranks = host("gpu-node", 2, FOUR_GPUS[:2]) + host("cpu-node", 2, ())
    assert decide("auto", ranks) == Decision("gloo", ("cpu",) * 4)
    with pytest.raises(UserError, match=r"rank\(s\) \[2, 3\] \(host cpu-node"):
        decide("nccl", ranks)


def test_gloo_asked_for_stays_on_cpus_even_with_gpus():
    assert decide("gloo", host("n1", 2, FOUR_GPUS)) == Decision("gloo", ("cpu", "cpu"))
    assert decide("auto", host("n1", 1, ())) == Decision("gloo", ("cpu",))
    with pytest.raises(UserError, match="unknown"):
        decide("mpi", host("n1", 1, ()))


def test_auto_backend_without_gpus_is_gloo_on_cpu():
    if torch.cuda.is_available():
        assert resolve_backend(Cluster.from_mpi(), "auto")[0] == "nccl"
    else:
        assert resolve_backend(Cluster.from_mpi(), "auto") == ("gloo", "cpu")


def test_ranks_share_the_host_cores_and_more_threads_than_cores_are_warned_of(capsys):
    before = torch.get_num_threads()
    try:
        cores = len(os.sched_getaffinity(0))
        four = RankInfo(rank=0, local_rank=0, world_size=4, local_world_size=4, host="h")
        assert configure_threads(four, None) == max(1, cores // 4) == torch.get_num_threads()
        assert capsys.readouterr().out == ""
        assert configure_threads(four, cores) == cores == torch.get_num_threads()  # --threads wins, and is warned of
        assert (f"mpi_train: warning: --threads {cores} for each of 4 rank(s) on h asks for {4 * cores} threads of "
                f"{cores} core(s)") in capsys.readouterr().out
        second = RankInfo(rank=1, local_rank=1, world_size=4, local_world_size=4, host="h")
        assert configure_threads(second, cores) == cores and capsys.readouterr().out == ""  # once a host
        assert configure_threads(RankInfo(0, 0, 1, 1, "h"), cores) == cores and capsys.readouterr().out == ""
    finally:
        torch.set_num_threads(before)


def test_meeting_every_batch_shape_leaves_the_model_and_random_streams_alone():
    import torch

    from mpi_train.devices import meet_shapes
    from mpi_train.models import build_model

    model = build_model("mnist_cnn")
    before, state = {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()
    meet_shapes(model, (1, 28, 28), {8, 3, 1}, {16, 5}, torch.device("cpu"))  # dropout drew on the copy only
    assert torch.equal(torch.get_rng_state(), state) and model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
