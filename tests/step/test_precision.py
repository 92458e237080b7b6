"""--precision: what each name resolves to on this machine's CPU, what autocast then computes in, and the float16
loss scaler's arithmetic (torch's own kernels) and state."""

from dataclasses import replace

import pytest
import torch
from torch import nn

from mpi_train.config import JobInfo, TrainConfig
from mpi_train.errors import UserError
from mpi_train.reporter import Reporter
from mpi_train.step.precision import PRECISIONS, LossScaler, autocast_runs, cpu_flags, resolve, slow_on_cpu
from mpi_train.tracking.runs import run_params

CPU = torch.device("cpu")


def test_auto_is_32_true_on_a_cpu_and_32_true_runs_without_autocast():
    assert resolve("auto", CPU) is PRECISIONS["32-true"]
    with PRECISIONS["32-true"].autocast(CPU):
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("name, dtype", [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)])
def test_a_mixed_precision_runs_a_linear_layer_in_its_dtype_on_a_cpu_and_keeps_the_weights_float32(name, dtype):
    precision = resolve(name, CPU)
    layer = nn.Linear(8, 4)
    with precision.autocast(CPU):
        out = layer(torch.randn(2, 8))
    assert out.dtype == dtype and layer.weight.dtype == torch.float32
    out.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32  # backward, outside autocast, lands in the float32 weights


def test_a_dtype_autocast_cannot_run_on_a_device_is_refused():
    assert not autocast_runs(CPU, torch.float64)  # CPU autocast turns itself off for it
    assert not autocast_runs(torch.device("meta"), torch.float16)  # no autocast on this kind at all
    with pytest.raises(UserError, match=r"--precision 16-mixed autocasts to float16, which torch .* cannot do on "
                                        r"meta devices\. Use --precision 32-true, or auto\."):
        resolve("16-mixed", torch.device("meta"))


def test_the_scaler_unscales_exactly_and_flags_an_inf_in_any_gradient():
    scaler = LossScaler(CPU)
    gradients = [torch.tensor([3.0, -5.0]) * 2.0**16, torch.tensor([[0.25]]) * 2.0**16]
    found = scaler.unscale_(gradients)
    assert found.item() == 0.0
    assert gradients[0].tolist() == [3.0, -5.0] and gradients[1].tolist() == [[0.25]]
    gradients = [torch.ones(3), torch.tensor([1.0, float("inf")])]
    assert scaler.unscale_(gradients).item() == 1.0
    gradients = [torch.tensor([float("nan")])]
    assert scaler.unscale_(gradients).item() == 1.0


def test_the_scale_backs_off_on_an_overflow_and_grows_after_a_run_of_clean_steps():
    scaler = LossScaler(CPU, growth_interval=3)
    assert scaler.scaled(torch.tensor(0.5)).item() == 2.0**15
    scaler.update(torch.ones(1), skipped=True)
    assert scaler.state_dict() == {"scale": 2.0**15, "growth_tracker": 0, "skipped_steps": 1}
    for _ in range(2):
        scaler.update(torch.zeros(1), skipped=False)
    assert scaler.state_dict() == {"scale": 2.0**15, "growth_tracker": 2, "skipped_steps": 1}
    scaler.update(torch.zeros(1), skipped=False)  # the third clean step in a row
    assert scaler.state_dict() == {"scale": 2.0**16, "growth_tracker": 0, "skipped_steps": 1}


def test_the_scalers_state_comes_back_whole():
    scaler = LossScaler(CPU)
    scaler.update(torch.ones(1), skipped=True)
    scaler.update(torch.zeros(1), skipped=False)
    resumed = LossScaler(CPU)
    resumed.load_state_dict(scaler.state_dict())
    assert resumed.state_dict() == scaler.state_dict() == {"scale": 2.0**15, "growth_tracker": 1,
                                                             "skipped_steps": 1}
    assert resumed.scale.dtype == torch.float32 and resumed.growth_tracker.dtype == torch.int32


def test_the_resolved_precision_is_what_the_start_line_says_and_mlflow_records():
    config = TrainConfig()  # --precision auto
    job = JobInfo(world_size=2, backend="gloo", hosts=("h1", "h1"), threads=1, rendezvous="h1:1234",
                  batch_size_per_rank=32, steps_per_epoch=4, total_steps=4, precision="bf16-mixed")
    assert run_params(config, job, ["h1"])["precision"] == "bf16-mixed"
    assert config.as_dict()["precision"] == "auto"  # the job file keeps what was asked
    lines = []
    Reporter(config.as_dict(), 64, None, print_fn=lines.append).start(job)
    assert "4 steps, precision bf16-mixed (--precision auto), rendezvous" in lines[0] and len(lines) == 1
    slow = slow_on_cpu(PRECISIONS["16-mixed"], CPU, frozenset({"avx2"}))
    Reporter(config.as_dict(), 64, None, print_fn=lines.append).start(replace(job, warnings=(slow,)))
    assert lines[2] == f"mpi_train: warning: {slow}"  # beneath the start line


def test_a_mixed_precision_the_cpu_has_no_arithmetic_for_is_warned_of():
    cpu, float16, bfloat16 = torch.device("cpu"), PRECISIONS["16-mixed"], PRECISIONS["bf16-mixed"]
    avx512 = frozenset({"avx512f", "avx512_bf16"})
    said = slow_on_cpu(float16, cpu, avx512)
    assert said.startswith("--precision 16-mixed on a CPU without float16 arithmetic (it has neither avx512_fp16 nor "
                           "amx_fp16)") and said.endswith("bf16-mixed (this CPU has avx512_bf16) trains faster here.")
    assert slow_on_cpu(bfloat16, cpu, avx512) is None and slow_on_cpu(float16, cpu, avx512 | {"amx_fp16"}) is None
    assert slow_on_cpu(bfloat16, cpu, frozenset({"avx2"})).endswith("32-true trains faster here.")
    assert slow_on_cpu(PRECISIONS["32-true"], cpu, frozenset()) is None
    assert slow_on_cpu(float16, torch.device("meta"), frozenset()) is None  # a GPU's units are another matter
    assert "avx512f" in cpu_flags() or "sse2" in cpu_flags()  # this machine's, read from /proc/cpuinfo
