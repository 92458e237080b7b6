"""Float32 against bfloat16 autocast on a CPU, the MNIST CNN alone in one process, for docs/results.md ("Precision on
CPUs"): the same seed, the same batches and plain SGD at a constant rate, forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16) (backward outside it, as Lightning's bf16-mixed runs it), trained side by
side, a step of one and a step of the other in turn, so a load that comes and goes on shared cores weighs on both.

    python scripts/cpu_precision.py [--data-dir DIR] [--lr 0.05] [--steps 20] [--batch-size 256] [--threads 2]
    python scripts/cpu_precision.py --diagnose [--seeds 4] ...   # why the losses part, if they do

Prints each side's step time (the median of the steps after the first 2) and both loss curves. --data-dir trains on
MNIST's training images (a folder holding MNIST/raw/, raw/ or the IDX files themselves); without it, on the
project's synthetic images. --momentum gives SGD momentum (default none). --diagnose adds:

1. the ops each side runs and their dtypes, forward and backward (what CPU autocast casts, and what follows a cast);
2. each parameter's gradient at step 1 against float32's (relative error), beside the gap between two float32
   batches' gradients, the noise SGD steps with anyway;
3. the loss after --steps of variants: one module at a time kept in float32 (autocast off in it), the loss as
   log_softmax (bfloat16 under CPU autocast) then nll_loss, dropout off, float32 started from weights rounded to
   bfloat16 (a perturbation the size of bfloat16's rounding, float32 thereafter), --lr / 5, float16 autocast with a
   CPU gradient scaler.

--seeds N adds the loss after --steps for seeds 0 to N - 1 both ways (each seed its own initial weights, dropout
masks and order of the images): whether bfloat16 is worse on average, or only lands elsewhere.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mpi_train.data.sets import MNIST_MEAN, MNIST_STD, SyntheticImages
from mpi_train.models import INPUT_SHAPES, build_model

SHAPE = INPUT_SHAPES["mnist_cnn"]
UNTIMED = 2  # the first steps allocate and pick kernels
MODULES = {"conv1": "features.0", "conv2": "features.2", "fc1": "classifier.0", "fc2": "classifier.3"}
SHORT = {None: "float32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class Arm:
    """One way to train: what autocast casts to (None: no autocast), the modules kept out of it, and the rest."""

    name: str
    dtype: torch.dtype | None = None
    float32_modules: tuple[str, ...] = ()
    dropout: float | None = None  # None: the model's own (0.25 and 0.5)
    start_rounded: bool = False  # float32 from weights rounded to bfloat16 and back
    lr_scale: float = 1.0
    log_softmax_first: bool = False  # F.log_softmax then F.nll_loss, as the classic MNIST example ends
    against: str = "float32"  # the arm whose loss curve it is compared with


@dataclass
class Run:
    """An arm's model, optimizer and random stream, stepped one step at a time beside another's."""

    arm: Arm
    lr: float
    momentum: float
    seed: int
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def __post_init__(self):
        torch.manual_seed(self.seed)
        self.net = build_model("mnist_cnn", self.arm.dropout, SHAPE)
        if self.arm.start_rounded:
            with torch.no_grad():
                for p in self.net.parameters():
                    p.copy_(p.to(torch.bfloat16).float())
        for name in self.arm.float32_modules:
            keep_float32(self.net.get_submodule(MODULES[name]))
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=self.lr * self.arm.lr_scale, momentum=self.momentum)
        # float16's small gradients flush to zero without a loss scale; bfloat16 has float32's range
        self.scaler = torch.amp.GradScaler("cpu") if self.arm.dtype == torch.float16 else None
        self.rng = torch.get_rng_state()  # dropout's masks: its own stream, whatever runs beside it

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        torch.set_rng_state(self.rng)
        begun = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = forward_loss(self.net, images, labels, self.arm.dtype, self.arm.log_softmax_first)
        if self.scaler:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.times.append(time.perf_counter() - begun)
        self.losses.append(loss.item())
        self.rng = torch.get_rng_state()

    @property
    def step_s(self) -> float:
        return statistics.median(self.times[UNTIMED:] or self.times)


def keep_float32(module: nn.Module) -> None:
    """Run `module` with autocast off and its inputs in float32: its forward, and so its backward, in float32."""
    inner = module.forward

    def forward(*inputs):
        with torch.autocast("cpu", enabled=False):
            return inner(*(x.float() for x in inputs))
    module.forward = forward


def forward_loss(net: nn.Module, images: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype | None,
                 log_softmax_first: bool = False):
    """Forward and loss under autocast (backward runs outside it, with the dtypes forward recorded). CPU autocast
    runs cross_entropy and nll_loss in float32 but log_softmax in the lower dtype (CUDA's runs it in float32)."""
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        logits = net(images)
        if log_softmax_first:
            return F.nll_loss(F.log_softmax(logits, dim=1), labels)
        return F.cross_entropy(logits, labels)


def read_idx(path: Path) -> torch.Tensor:
    """An IDX file (MNIST's format): a big-endian header of dimension sizes, then unsigned bytes."""
    raw = path.read_bytes()
    dims = raw[3]
    sizes = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(raw[4 + 4 * dims:]), dtype=torch.uint8).view(*sizes)


def load(data_dir: str | None, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """`samples` training images and labels in a fixed random order: MNIST's, normalised as the jobs normalise them,
    or the project's synthetic ones."""
    order = torch.Generator().manual_seed(seed)
    if data_dir is None:
        data = SyntheticImages(samples, SHAPE, train=True)
        pick = torch.randperm(samples, generator=order)
        return data.images[pick], data.labels[pick], "synthetic images"
    root = Path(data_dir)
    folder = next((d for d in (root / "MNIST" / "raw", root / "raw", root)
                   if (d / "train-images-idx3-ubyte").is_file()), None)
    if folder is None:
        raise SystemExit(f"{root} holds no train-images-idx3-ubyte (in MNIST/raw/, raw/ or itself): point --data-dir "
                         f"at a copy of MNIST's four IDX files, or leave it out for synthetic images.")
    images = read_idx(folder / "train-images-idx3-ubyte").unsqueeze(1)
    labels = read_idx(folder / "train-labels-idx1-ubyte").long()
    pick = torch.randperm(len(labels), generator=order)[:samples]
    images = (images[pick].float() / 255 - MNIST_MEAN[0]) / MNIST_STD[0]
    return images, labels[pick], f"MNIST ({folder})"


def batches(images: torch.Tensor, labels: torch.Tensor, batch: int):
    for start in range(0, len(labels) - batch + 1, batch):
        yield images[start:start + batch], labels[start:start + batch]


def train(arms: list[Arm], data, args, seed: int) -> list[Run]:
    """The arms trained side by side on the same batches, a step of each in turn."""
    runs = [Run(arm, args.lr, args.momentum, seed) for arm in arms]
    for images, labels in batches(*data, args.batch_size):
        for run in runs:
            run.step(images, labels)
    return runs


def print_curves(runs: list[Run]) -> None:
    print("step  " + "".join(f"{run.arm.name:>14}" for run in runs))
    for step in range(len(runs[0].losses)):
        print(f"{step + 1:>4}  " + "".join(f"{run.losses[step]:>14.4f}" for run in runs))
    print("s/step" + "".join(f"{run.step_s:>14.3f}" for run in runs) + f"   (median of steps {UNTIMED + 1}+)")


class OpDtypes(TorchDispatchMode):
    """Each aten op run, with the dtypes of its floating-point inputs -> outputs (below autocast: after its casts)."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, set[str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))

        def dtypes(tree) -> str:
            return ",".join(sorted({SHORT.get(t.dtype, str(t.dtype).removeprefix("torch.")) for t in tree_leaves(tree)
                                    if isinstance(t, torch.Tensor) and t.is_floating_point()}))
        name = func.overloadpacket.__name__
        if name not in ("detach", "view", "t", "empty_like", "ones_like"):
            self.seen.setdefault(name, set()).add(f"{dtypes((args, kwargs))}->{dtypes(out)}")
        return out


def print_ops(images: torch.Tensor, labels: torch.Tensor) -> None:
    net = build_model("mnist_cnn", None, SHAPE)
    for dtype in (torch.bfloat16, torch.float16):
        with OpDtypes() as forward:
            loss = forward_loss(net, images, labels, dtype)
        with OpDtypes() as backward:
            loss.backward()
        net.zero_grad(set_to_none=True)
        print(f"\nops under {SHORT[dtype]} autocast (inputs->outputs):")
        for phase, log in (("forward", forward), ("backward", backward)):
            print(f"  {phase}: " + "; ".join(f"{op} {' '.join(sorted(kinds))}" for op, kinds in log.seen.items()))


def gradients(net: nn.Module, images, labels, dtype) -> dict[str, torch.Tensor]:
    net.zero_grad(set_to_none=True)
    forward_loss(net, images, labels, dtype).backward()
    return {name: p.grad.clone() for name, p in net.named_parameters()}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def print_gradient_errors(data, args) -> None:
    """Step 1's gradients (the same weights, batch and dropout masks) against float32's, per parameter."""
    images, labels = data
    first, other = (images[:args.batch_size], labels[:args.batch_size]), (images[args.batch_size:2 * args.batch_size],
                                                                         labels[args.batch_size:2 * args.batch_size])
    torch.manual_seed(args.seed)
    net = build_model("mnist_cnn", 0.0, SHAPE)  # dropout off: the same network for every pass
    reference = gradients(net, *first, None)
    sides = {"bf16": gradients(net, *first, torch.bfloat16), "fp16": gradients(net, *first, torch.float16),
             "fp32 2nd batch": gradients(net, *other, None)}
    for name, module in MODULES.items():
        keep = build_model("mnist_cnn", 0.0, SHAPE)
        keep.load_state_dict(net.state_dict())
        keep_float32(keep.get_submodule(module))
        sides[f"bf16 {name} fp32"] = gradients(keep, *first, torch.bfloat16)
    print("\nstep 1's gradients, |g - g_float32| / |g_float32| per parameter (dropout off); the last column: "
          "float32's gradient of the next batch against the first's")
    order = [key for key in sides if key != "fp32 2nd batch"] + ["fp32 2nd batch"]
    print(f"{'parameter':<22}{'|g|':>10}" + "".join(f"{key:>16}" for key in order))
    for name, grad in reference.items():
        print(f"{name:<22}{grad.norm().item():>10.3g}" + "".join(f"{relative(sides[key][name], grad):>16.2e}"
                                                                for key in order))


def print_variants(data, args) -> None:
    arms = [Arm("float32"), Arm("bf16", torch.bfloat16)]
    arms += [Arm(f"bf16 {name} fp32", torch.bfloat16, (name,)) for name in MODULES]
    arms += [Arm("bf16 convs fp32", torch.bfloat16, ("conv1", "conv2")),
             Arm("bf16 linears fp32", torch.bfloat16, ("fc1", "fc2")),
             Arm("bf16 log_softmax in bf16", torch.bfloat16, log_softmax_first=True),
             Arm("float32 no dropout", dropout=0.0),
             Arm("bf16 no dropout", torch.bfloat16, dropout=0.0, against="float32 no dropout"),
             Arm("float32 from bf16 weights", start_rounded=True),
             Arm(f"float32 lr {args.lr / 5:g}", lr_scale=0.2),
             Arm(f"bf16 lr {args.lr / 5:g}", torch.bfloat16, lr_scale=0.2, against=f"float32 lr {args.lr / 5:g}"),
             Arm("fp16 + scaler", torch.float16)]
    runs = train(arms, data, args, args.seed)
    curves = {run.arm.name: run.losses for run in runs}
    print(f"\nthe loss after step {args.steps}; in brackets, the largest step-by-step difference from the curve named:")
    for run in runs:
        apart = max(abs(a - b) for a, b in zip(run.losses, curves[run.arm.against]))
        print(f"  {run.arm.name:<28}{run.losses[-1]:>8.4f}  ({apart:.4f} from {run.arm.against})  "
              f"{run.step_s:.3f} s/step")


def print_seeds(args, load_data: Callable[[int], tuple]) -> None:
    finals = {"float32": [], "bf16": []}
    for seed in range(args.seeds):
        runs = train([Arm("float32"), Arm("bf16", torch.bfloat16)], load_data(seed), args, seed)
        for run in runs:
            finals[run.arm.name].append(run.losses[-1])
    print(f"\nthe loss after step {args.steps} for seeds 0-{args.seeds - 1} (init, dropout and batches):")
    for name, losses in finals.items():
        spread = f" ± {statistics.stdev(losses):.3f}" if len(losses) > 1 else ""
        print(f"  {name:<8}" + "".join(f"{x:>8.3f}" for x in losses) + f"   mean {statistics.mean(losses):.3f}{spread}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="MNIST's IDX files (default: synthetic images)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--diagnose", action="store_true", help="op dtypes, gradient errors, variants")
    parser.add_argument("--seeds", type=int, default=0, help="the final loss of this many seeds both ways")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return load(args.data_dir, args.steps * args.batch_size, seed)[:2]

    *data, source = load(args.data_dir, args.steps * args.batch_size, args.seed)
    print(f"MNIST CNN, {source}, batch {args.batch_size}, SGD lr {args.lr:g} constant, momentum {args.momentum:g}, "
          f"{args.steps} steps, seed {args.seed}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print_curves(train([Arm("float32"), Arm("bf16-mixed", torch.bfloat16)], data, args, args.seed))
    if args.diagnose:
        print_ops(data[0][:8], data[1][:8])
        print_gradient_errors(data, args)
        print_variants(data, args)
    if args.seeds:
        print_seeds(args, load_data)


if __name__ == "__main__":
    main()
