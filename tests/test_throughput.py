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
         ("NVIDIA GeForce RTX 4090", "fp32", None)]


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
