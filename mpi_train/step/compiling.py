"""--compile: the step's forward and backward as torch.compile graphs.

The model's forward (under fsdp each unit's) is replaced in place by its compiled self after the sync method has
wrapped the model, so that every caller runs the graphs: the step through the method's wrapper and the test
evaluation through the model itself, each module's hooks outside its graph. Under ddp the forward is compiled while
DistributedDataParallel runs it, which is what torch's compiled DDP is: dynamo's DDPOptimizer
(torch._dynamo.config.optimize_ddp) cuts the graph at DDP's bucket boundaries, so that each bucket's allreduce still
starts as soon as its part of the backward is done. Every sync method compiles (docs/sync-methods.md says what
compiling changes in each one's overlap).

Compiling happens at setup, timed apart (time/compile_s): a warm-up runs each batch size the job trains and scores
on zeros, and leaves the model, its gradients, its buffers and the random streams as it found them, so that no step
pays for a compile and the job's losses are those it would have had without the warm-up.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable

import torch
from torch import nn

from ..sync.base import INSIDE_FSDP, SyncMethod
from ..sync.fsdp import units
from ..sync.zero import Zero

# torch.compile's modes: reduce-overhead replays the step as CUDA graphs; max-autotune also searches kernels
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

CXX_NAMES = ("g++", "c++", "clang++")  # what inductor builds its CPU kernels with, when $CXX names none
TRITON_CC_NAMES = ("gcc", "clang")  # what Triton builds each kernel's launcher with, when $CC names none, its order

# the graphs one compiled forward may need: training's full and last batch, scoring's two, and room to spare
GRAPHS_PER_MODULE = 8

# channels_last for conv nets under --compile on CUDA: "1" always, "0" never, unset: wherever the model convolves
CHANNELS_LAST_SWITCH = "MPI_TRAIN_CHANNELS_LAST"


def working_compiler(variable: str, names: Iterable[str]) -> tuple[str | None, str]:
    """The first compiler that answers `--version`: the one $`variable` names if it is set (a build would use it
    and no other), else the first of `names` on the PATH; and what was tried, for a message."""
    named = os.environ.get(variable)
    candidates = [named] if named else list(names)
    tried = f"${variable} ({named})" if named else f"${variable} is unset; tried {', '.join(candidates)}"
    for candidate in candidates:
        path = shutil.which(candidate)
        if path is None:
            continue
        try:
            answered = subprocess.run([path, "--version"], capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if answered.returncode == 0:
            return path, tried
    return None, tried


def toolchain_error(device: torch.device, mode: str) -> str | None:
    """Why torch.compile cannot build this rank's kernels (None when it can): on a CPU inductor compiles C++ and
    needs a C++ compiler; on CUDA it writes Triton kernels, which need Triton and a C compiler for their launchers.
    The C++ compiler found is the one inductor builds with (it looks for $CXX or g++ alone)."""
    if device.type == "cuda":
        try:
            importlib.import_module("triton")
        except ImportError as error:
            return (f"inductor, torch.compile's compiler, writes CUDA kernels in Triton, which this Python cannot "
                    f"import ({type(error).__name__}: {error}). Install the Triton release that torch "
                    f"{torch.__version__} names (its CUDA wheels depend on it: pip install triton), or drop --compile "
                    f"to train eagerly.")
        compiler, tried = working_compiler("CC", TRITON_CC_NAMES)
        if compiler is None:
            return (f"Triton builds each kernel's launcher with a C compiler, and none answers here ({tried}). "
                    f"Install one (e.g. apt-get install gcc) or point $CC at one, or drop --compile to train eagerly.")
        return None
    if mode == "reduce-overhead":
        return (f"--compile-mode {mode} replays each step as CUDA graphs, and this job trains on CPUs, where there are "
                f"none: it would compile as --compile-mode default does. Use --compile-mode default (or "
                f"max-autotune, which also searches CPU kernels).")
    compiler, tried = working_compiler("CXX", CXX_NAMES)
    if compiler is None:
        return (f"inductor, torch.compile's compiler, builds CPU kernels with a C++ compiler, and none answers here "
                f"({tried}). Install one (e.g. apt-get install g++) or point $CXX at one, or drop --compile to train "
                f"eagerly.")
    import torch._inductor.config as inductor

    inductor.cpp.cxx = (compiler,)  # the one found: inductor itself would look for $CXX or g++ only
    return None


def flags_error(config) -> str | None:
    """Why the job's compile flags cannot go together (None when they can), the same on every rank: --compile-mode
    without --compile. Every sync method compiles, so none is refused."""
    if not config.compile and config.compile_mode != COMPILE_MODES[0]:
        return (f"--compile-mode {config.compile_mode} picks how --compile compiles the model, and this job does not "
                f"compile, so it would do nothing. Add --compile, or drop --compile-mode.")
    return None


def wants_channels_last(model: nn.Module, device: torch.device, method: SyncMethod | None = None) -> bool:
    """Whether a compiled conv net keeps its weights channels_last (NHWC): on CUDA, where cuDNN's and Triton's
    convolutions are written for it, for a model that has a 2-d convolution; $MPI_TRAIN_CHANNELS_LAST=1 or 0 decides
    instead (the GPU check measures both). On a CPU the memory format is left as it is, and under FSDP2, which shards
    contiguous parameters only (it refuses a channels_last weight). `method`: the job's (None: a bare model)."""
    if device.type != "cuda" or (method is not None and method.traits.sends == INSIDE_FSDP):
        return False
    switch = os.environ.get(CHANNELS_LAST_SWITCH, "")
    if switch in ("0", "1"):
        return switch == "1"
    return any(isinstance(module, nn.Conv2d) for module in model.modules())


def held_in_warmup(method: SyncMethod, net: nn.Module) -> contextlib.AbstractContextManager:
    """What the warm-up's backward runs under: the method's accumulating(), which holds every message back (our
    hooks; DDP's no_sync), so that nothing is sent and no compressor state moves. FSDP2's own accumulation keeps
    unsharded gradients that outlive zero_grad and would add into the first step's: its warm-up reduce-scatters as a
    step does, on every rank alike, and the gradients are dropped after."""
    if method.traits.sends == INSIDE_FSDP:
        return contextlib.nullcontext()
    return method.accumulating(net)


def shared_sizes(cluster, batch_sizes: tuple[set[int], set[int]]) -> tuple[set[int], set[int]]:
    """Every rank's training and test batch sizes, together (collective): ranks whose shards end in different last
    batches warm up the same shapes, so that the collectives a wrapper runs in them pair up."""
    every = cluster.allgather([sorted(sizes) for sizes in batch_sizes])
    return tuple({size for sizes in every for size in sizes[kind]} for kind in range(2))


def compiled_modules(method: SyncMethod, model: nn.Module) -> list[nn.Module]:
    """The modules whose forward becomes a graph: the model's; under FSDP2 each unit's, as FSDP2's users compile it
    (its hooks gather and free a unit's parameters around the unit's forward, eagerly: a graph break each, which
    would leave the model's own forward in pieces too small to be worth a graph)."""
    return units(model) if method.traits.sends == INSIDE_FSDP else [model]


def compile_forwards(method: SyncMethod, model: nn.Module, mode: str, backend: str = "inductor") -> None:
    """Compile the forward of each of compiled_modules in place, so that every caller runs the graphs: the step
    through the method's wrapper (DDP runs it: DDPOptimizer cuts it at DDP's buckets), the test evaluation through
    the model itself. A module's hooks stay outside its graph. zero's pre-hooks wait for each layer's all-gather as
    the forward reaches it: a graph can neither wait for a future nor guard the pending ones, so under --compile its
    all-gathers are all waited for before the forward's graph starts."""
    modules = compiled_modules(method, model)
    # FSDP2's units of torch's own layers share one code object, whose graphs (one per unit, batch size and train or
    # eval) dynamo counts against one limit, beyond which it would run the rest eagerly: raised to fit them, and a
    # job that reaches it anyway fails rather than go on eagerly
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, GRAPHS_PER_MODULE * len(modules))
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    for module in modules:
        # one graph per batch size: the sizes are few and known (the warm-up's)
        module.forward = torch.compile(module.forward, mode=mode, dynamic=False, backend=backend)
    if isinstance(method, Zero):
        model.register_forward_pre_hook(lambda _module, _inputs: method.settle())


def compile_net(net: nn.Module, model: nn.Module, method: SyncMethod, mode: str, device: torch.device,
                shapes: Callable[[], None], backend: str = "inductor") -> float:
    """Compile `model`'s forward in place (compile_forwards: `net`, the method's wrapper, runs it) and run `shapes`
    (every batch size the job trains and scores, devices.run_shapes) under held_in_warmup: the seconds it took. Its
    buffers (BatchNorm's statistics), gradients and random streams are as before. `backend`: torch.compile's;
    aot_eager captures the same graphs, forward and backward, and runs them with torch's own kernels, no compiler
    needed."""
    import torch._inductor.config as inductor  # (torch.compile's compiler: imported by jobs that compile only)

    torch._dynamo.reset()  # a process that ran a job before starts afresh: its graphs guard the earlier model
    if device.type == "cpu":  # a machine with CUDA's toolkit and no GPU: torch says "No CUDA runtime is found" per rank
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    # dropout draws from torch's generator, as eager does: --compile changes a job's speed, not its losses (but for
    # channels_last: a mask drawn in memory order then falls on other elements)
    inductor.fallback_random = True
    compile_forwards(method, model, mode, backend)
    buffers = [buffer.detach().clone() for buffer in model.buffers()]
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), held_in_warmup(method, net):
        # once: under a CUDA graph mode the first step records the graphs (about 25 ms for the MNIST CNN on an H200);
        # running the shapes again here to record them made torch 2.11 raise on an output a later replay overwrote
        shapes()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    with torch.no_grad():
        for buffer, before in zip(model.buffers(), buffers):
            buffer.copy_(before)
    model.zero_grad(set_to_none=True)
    return seconds


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process (a recompile adds one): the difference across a stretch
    of a job is what it compiled there."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
