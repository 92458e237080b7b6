"""--compile's refusals against the tools this machine really has, channels_last's rule, and the warm-up that leaves a
model as it found it (one process; the compiled job against the eager one is tests/test_train.py's np2 pair)."""

import os
import shutil
import sys

import pytest
import torch
import torch._inductor.config as inductor
import torch.nn.functional as F
from torch import nn

from mpi_train.commands.train import parse_config
from mpi_train.devices import run_shapes
from mpi_train.errors import UserError
from mpi_train.models import build_model
from mpi_train.step.compiling import (
    CHANNELS_LAST_SWITCH,
    compile_net,
    graphs_compiled,
    toolchain_error,
    wants_channels_last,
)
from mpi_train.sync.bucketed import Bucketed
from mpi_train.sync.compression.powersgd import PowerSGD

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device's type is all the checks read: no GPU needed


@pytest.fixture
def bare_path(tmp_path, monkeypatch):
    """A PATH of one empty folder, and neither $CXX nor $CC: no compiler can be found."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(inductor.cpp, "cxx", inductor.cpp.cxx)  # put back whatever a check sets
    return tmp_path


def test_a_cpu_without_a_cxx_compiler_is_refused(bare_path):
    message = toolchain_error(CPU, "default")
    assert "builds CPU kernels with a C++ compiler, and none answers here ($CXX is unset; tried g++, c++, clang++)" in \
        message and "apt-get install g++" in message and "drop --compile" in message


def test_cxx_naming_a_missing_compiler_is_refused_by_that_name(bare_path, monkeypatch):
    monkeypatch.setenv("CXX", "/nowhere/g++")
    assert "none answers here ($CXX (/nowhere/g++))" in toolchain_error(CPU, "default")


def test_the_cxx_compiler_found_under_another_name_is_the_one_inductor_builds_with(bare_path):
    real = shutil.which("g++", path="/usr/bin:/usr/local/bin") or shutil.which("clang++", path="/usr/bin")
    if real is None:
        pytest.skip("no C++ compiler on this machine to find under another name")
    (bare_path / "c++").symlink_to(real)
    assert toolchain_error(CPU, "default") is None
    assert inductor.cpp.cxx == (str(bare_path / "c++"),)  # inductor alone would look for $CXX or g++


def test_cuda_graphs_on_a_cpu_are_refused_as_doing_nothing():
    message = toolchain_error(CPU, "reduce-overhead")
    assert message.startswith("--compile-mode reduce-overhead replays each step as CUDA graphs, and this job trains "
                              "on CPUs") and "--compile-mode default" in message


def test_cuda_without_triton_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # what Python does for a module that cannot be imported
    message = toolchain_error(CUDA, "default")
    assert "writes CUDA kernels in Triton, which this Python cannot import (ModuleNotFoundError" in message
    assert f"torch {torch.__version__}" in message and "pip install triton" in message


def test_cuda_without_a_c_compiler_for_tritons_launchers_is_refused(bare_path):
    pytest.importorskip("triton")
    message = toolchain_error(CUDA, "default")
    assert "Triton builds each kernel's launcher with a C compiler, and none answers here ($CC is unset; tried gcc, " \
           "clang)" in message


def test_cuda_with_triton_and_a_c_compiler_compiles():
    pytest.importorskip("triton")
    if not (os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler here")
    assert toolchain_error(CUDA, "max-autotune") is None


def test_compile_mode_without_compile_is_refused():
    with pytest.raises(UserError) as refused:
        parse_config(["--compile-mode", "max-autotune"]).validate(world_size=2)
    assert str(refused.value) == ("--compile-mode max-autotune picks how --compile compiles the model, and this job "
                                  "does not compile, so it would do nothing. Add --compile, or drop --compile-mode.")
    parse_config(["--compile", "--compile-mode", "max-autotune"]).validate(world_size=2)
    parse_config(["--compile-mode", "default"]).validate(world_size=2)  # the default, which does nothing either way


def test_conv_nets_run_channels_last_on_cuda_only_and_the_switch_decides_there(monkeypatch):
    monkeypatch.delenv(CHANNELS_LAST_SWITCH, raising=False)
    cnn, gpt = build_model("mnist_cnn"), build_model("gpt")
    assert wants_channels_last(cnn, CUDA) and not wants_channels_last(gpt, CUDA)
    assert not wants_channels_last(cnn, CPU)
    monkeypatch.setenv(CHANNELS_LAST_SWITCH, "0")
    assert not wants_channels_last(cnn, CUDA)
    monkeypatch.setenv(CHANNELS_LAST_SWITCH, "1")
    assert wants_channels_last(gpt, CUDA) and not wants_channels_last(cnn, CPU)


class Batched(nn.Module):
    """A linear layer, BatchNorm (buffers a forward moves) and dropout (a random draw): what a warm-up could disturb."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3))

    def forward(self, x):
        return self.layers(x)


def test_the_warmup_compiles_every_shape_and_leaves_the_model_its_gradients_and_random_streams_as_they_were():
    torch.manual_seed(0)
    model = Batched()
    method = Bucketed(compressor=PowerSGD(rank=1, start_step=0))  # error feedback: what a sent message would move
    net = method.wrap(model)  # its hooks learn the backward order in the first step unless held
    compressor_draws = method.compressor.generator.get_state()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    random_state = torch.get_rng_state()
    seconds = compile_net(net, model, method, "default", CPU,  # aot_eager: --compile's graphs, no C++ to build
                          lambda: run_shapes(net, model, (6,), {4, 3}, {5}, CPU), backend="aot_eager")
    assert seconds > 0 and method.arrivals == []  # nothing arrived: held, nothing sent
    assert method.compressor.memory == {} and torch.equal(method.compressor.generator.get_state(), compressor_draws)
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())
    assert all(param.grad is None for param in model.parameters()) and model.training
    assert torch.equal(torch.get_rng_state(), random_state)
    compiled = graphs_compiled()
    inputs, labels = torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
    F.cross_entropy(net(inputs), labels).backward()  # a step of the trained size, then the scored one
    model.eval()
    with torch.no_grad():
        model(torch.randn(5, 6))
    assert graphs_compiled() == compiled, "a shape the warm-up ran was compiled again"
    assert method.arrivals and all(param.grad is not None for param in model.parameters())
