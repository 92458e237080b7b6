"""Throughput figures: FLOPs counted against a closed form, the peak table, and the figures' arithmetic."""

import pytest
import torch

from mpi_train.models import build_model
from mpi_train.throughput import Throughput, compute_dtype, flops, flops_per_sample, peak_flops


def test_the_mnist_cnns_flops_are_three_forwards_less_the_first_layers_input_gradient():
    # multiply-adds of one sample's forward: conv 1->32 (26x26 out), conv 32->64 (24x24 out), 9216->128, 128->10
    first_conv = 26 * 26 * 32 * 9
    macs = first_conv + 24 * 24 * 64 * 32 * 9 + 9216 * 128 + 128 * 10
    # backward: each layer's weight gradient and input gradient (a forward's worth each), none for the images
    expected = 2 * macs * 3 - 2 * first_conv
    before = torch.get_rng_state()
    assert flops_per_sample(lambda: build_model("mnist_cnn"), (1, 28, 28)) == expected
    assert torch.equal(torch.get_rng_state(), before)  # built on the meta device, no draws from torch's stream


def test_vgg11_costs_what_its_convolutions_do():
    assert flops_per_sample(lambda: build_model("vgg11"), (3, 32, 32)) == pytest.approx(0.913e9, rel=1e-3)


KNOWN = [("NVIDIA H200", "tf32", 494.7e12), ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),
         ("NVIDIA H100 PCIe", "fp32", 51.2e12), ("NVIDIA A100-SXM4-80GB", "tf32", 156e12), ("cpu", "fp32", None),
         ("NVIDIA GeForce RTX 4090", "fp32", None), ("NVIDIA H200", "bf16", 989.4e12),
         ("NVIDIA H200", "fp16", 989.4e12), ("NVIDIA H100 PCIe", "bf16", 756e12), ("NVIDIA H100 NVL", "bf16", 835.5e12),
         ("NVIDIA H200 NVL", "tf32", 417.5e12), ("NVIDIA A100-SXM4-40GB", "bf16", 312e12),
         ("NVIDIA A100 80GB PCIe", "fp16", 312e12), ("NVIDIA GeForce RTX 4090", "bf16", None), ("cpu", "bf16", None)]


@pytest.mark.parametrize("name,dtype,peak", KNOWN)
def test_the_peak_is_known_for_a100_h100_and_h200_only(name, dtype, peak):
    assert peak_flops(name, dtype) == peak


def test_figures_per_rank_data_share_and_mfu():
    speed = Throughput(flops_per_sample=1e9, device_name="NVIDIA H200", dtype="tf32", peak_flops=494.7e12)
    figures = speed.figures({"step_time_s": 0.01, "data_time_s": 0.001}, global_batch=256, world_size=4)
    assert figures["samples_per_s_per_rank"] == pytest.approx(6400)
    assert figures["data_share"] == pytest.approx(0.1)
    assert figures["flops_per_s"] == pytest.approx(6.4e12) and figures["mfu"] == pytest.approx(6.4e12 / 494.7e12)
    assert speed.describe(figures) == "6,400/rank, data 10%, 6.4 TFLOP/s/rank, MFU 1.3%"
    cpu = Throughput(1e9, "cpu", "fp32", None).figures({"step_time_s": 1.0, "data_time_s": 0.0}, 64, 2)
    assert "mfu" not in cpu and flops(cpu["flops_per_s"]) == "32 GFLOP/s"


def test_a_cpu_computes_in_fp32():
    assert compute_dtype(torch.device("cpu")) == "fp32"


@pytest.mark.parametrize("precision,dtype", [("32-true", "fp32"), ("bf16-mixed", "bf16"), ("16-mixed", "fp16")])
def test_a_mixed_precision_runs_at_its_autocast_dtypes_peak(precision, dtype):
    assert compute_dtype(torch.device("cpu"), precision) == dtype
    assert peak_flops("NVIDIA H100 80GB HBM3", dtype) == {"fp32": 66.9e12, "bf16": 989.4e12, "fp16": 989.4e12}[dtype]


def test_a_bf16_jobs_mfu_is_held_against_the_bf16_peak_and_a_cpu_reports_flops_only():
    cpu = Throughput.of(lambda: build_model("mnist_cnn"), (1, 28, 28), torch.device("cpu"), precision="bf16-mixed")
    assert cpu.dtype == "bf16" and cpu.peak_flops is None
    assert "mfu" not in cpu.figures({"step_time_s": 1.0, "data_time_s": 0.0}, 64, 1)
    # an H200 job: the same achieved FLOP/s is half the MFU against bf16's peak that it is against tf32's
    bf16 = Throughput(1e9, "NVIDIA H200", "bf16", peak_flops("NVIDIA H200", "bf16"))
    tf32 = Throughput(1e9, "NVIDIA H200", "tf32", peak_flops("NVIDIA H200", "tf32"))
    times = {"step_time_s": 0.01, "data_time_s": 0.0}
    assert bf16.figures(times, 256, 1)["mfu"] == pytest.approx(25.6e12 / 989.4e12)
    assert tf32.figures(times, 256, 1)["mfu"] == pytest.approx(2 * bf16.figures(times, 256, 1)["mfu"], rel=1e-3)
