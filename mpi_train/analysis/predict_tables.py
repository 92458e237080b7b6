"""What `python -m mpi_train predict` prints and draws: each method's predicted step, memory per rank, time to
accuracy and scaling, from the rows analysis/predict.py computes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import netmodel
from ..files import write_figure
from ..netmodel.memory import MemoryPrediction
from ..sync import SyncMethod


@dataclass(frozen=True)
class Row:
    """One method's predicted step on one cluster size, and what a rank holds under it."""

    ranks: int
    method: str
    compute_s: float
    comm_s: float
    exposed_s: float
    parts: dict = field(default_factory=dict)  # seconds per step of each collective (netmodel Prediction.parts)
    memory: MemoryPrediction | None = None  # bytes per rank
    background_s: float | None = None  # per step, averages sent in the background (--overlap)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_s

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s if self.step_s else 1.0


def format_single(rows: list[Row]) -> str:
    lines = [f"{'method':<20}{'compute_ms':>12}{'comm_ms':>12}{'exposed_ms':>12}{'step_ms':>12}{'efficiency':>12}"]
    for row in sorted(rows, key=lambda r: r.step_s):
        lines.append(f"{row.method:<20}{row.compute_s * 1e3:>12.1f}{row.comm_s * 1e3:>12.1f}"
                     f"{row.exposed_s * 1e3:>12.1f}{row.step_s * 1e3:>12.1f}{row.efficiency:>12.2f}")
    return "\n".join(lines)


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f}"


def format_memory(rows: list[Row]) -> str:
    """Memory per rank and communication by collective, least memory first: what a method buys and what it pays."""
    lines = [(f"{'method':<20}{'params_MiB':>12}{'grads_MiB':>11}{'optim_MiB':>11}{'total_MiB':>11}  "
             f"communication per step by collective")]
    for row in sorted((r for r in rows if r.memory is not None), key=lambda r: (r.memory.total, r.step_s)):
        held = row.memory
        params = mib(held.parameters) + (f"+{mib(held.gathered)}" if held.gathered else "")
        collectives = " + ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in row.parts.items())
        lines.append(f"{row.method:<20}{params:>12}{mib(held.gradients):>11}{mib(held.optimizer):>11}"
                     f"{mib(held.total):>11}  {collectives}")
    return "\n".join(lines)


def overlap_verdicts(rows: list[Row], methods: dict[str, SyncMethod]) -> list[str]:
    """For each method whose averages travel in the background: free (its transfer fits in the local steps until
    the next average) or what it costs per average when it does not."""
    lines = []
    for row in rows:
        if row.background_s is None:
            continue
        every = netmodel.averaging_every(methods[row.method])
        transfer, window = row.background_s * every, row.compute_s * every
        exposed = netmodel.overlapped_exposed(transfer, window)
        verdict = "free: it fits" if exposed <= 0 else f"exposed {exposed:.2f} s per average = transfer - compute"
        lines.append(f"{row.method} --overlap: an average every {every} steps takes {transfer:.2f} s against "
                     f"{window:.2f} s of their compute: {verdict}")
    return lines


def cuda_only_overlaps(rows: list[Row], methods: dict[str, SyncMethod]) -> list[str]:
    """For each method that overlaps its communication only on CUDA: exposed is the CUDA case; on CPU, comm."""
    return [f"{row.method}: exposed assumes CUDA; on CPU the step pays its comm, {row.comm_s * 1e3:.1f} ms "
            f"({methods[row.method].traits.overlaps_only_on_cuda})"
            for row in rows if methods[row.method].traits.overlaps_only_on_cuda]


def format_time_to_accuracy(rows: list[Row], steps: dict[str, int]) -> str:
    """Steps to accuracy (the method's, measured on any network) times the predicted step here, fastest first."""
    known = sorted(((row, steps[row.method]) for row in rows if row.method in steps),
                   key=lambda pair: pair[0].step_s * pair[1])
    lines = ["time to accuracy here = steps to accuracy (as given) x predicted step:",
             f"{'method':<20}{'steps':>8}{'step_ms':>12}{'time_s':>12}"]
    for row, count in known:
        lines.append(f"{row.method:<20}{count:>8}{row.step_s * 1e3:>12.1f}{row.step_s * count:>12.1f}")
    return "\n".join(lines)


def format_scaling(table: dict[int, list[Row]]) -> str:
    methods = [row.method for row in next(iter(table.values()))]
    width = max(12, max(len(m) for m in methods) + 2)
    lines = [f"{'ranks':>6}" + "".join(f"{m:>{width}}" for m in methods) + f"{'winner':>{width}}",
             "step time, ms (scaling efficiency)"]
    for ranks, rows in table.items():
        cells = "".join(f"{f'{r.step_s * 1e3:.0f} ({r.efficiency:.2f})':>{width}}" for r in rows)
        lines.append(f"{ranks:>6}{cells}{min(rows, key=lambda r: r.step_s).method:>{width}}")
    return "\n".join(lines)


def format_memory_scaling(table: dict[int, list[Row]]) -> str:
    methods = [row.method for row in next(iter(table.values()))]
    width = max(12, max(len(m) for m in methods) + 2)
    lines = [f"{'ranks':>6}" + "".join(f"{m:>{width}}" for m in methods)]
    for ranks, rows in table.items():
        lines.append(f"{ranks:>6}" + "".join(f"{mib(r.memory.total) if r.memory else '-':>{width}}" for r in rows))
    return "\n".join(lines)


def plot_scaling(table: dict[int, list[Row]], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = list(table)
    methods = [row.method for row in table[ranks[0]]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 9), sharex=True)
    for index, method in enumerate(methods):  # methods that predict alike (flat and ring) differ in line and marker
        style = {"linestyle": ("-", "--", "-.", ":")[index % 4], "marker": "os^Dv<>PX"[index % 9], "markersize": 5}
        steps = [next(r for r in table[n] if r.method == method) for n in ranks]
        top.plot(ranks, [1000 * r.step_s for r in steps], label=method, **style)
        bottom.plot(ranks, [r.efficiency for r in steps], label=method, **style)
    top.plot(ranks, [1000 * table[n][0].compute_s for n in ranks], color="black", linewidth=1, linestyle=":",
             label="compute alone (ideal)")
    top.set(xscale="log", yscale="log", ylabel="predicted step time (ms)", title=title)
    bottom.set(xscale="log", ylim=(0, 1.05), xlabel="ranks", ylabel="scaling efficiency (compute / step)")
    bottom.set_xticks(ranks, [str(n) for n in ranks])
    for axis in (top, bottom):
        axis.grid(alpha=0.3, which="both")
    top.legend(fontsize=8, ncol=2)
    return write_figure(fig, path)
