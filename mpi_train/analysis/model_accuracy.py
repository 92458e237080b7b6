"""How close the alpha-beta model comes: each method's measured sync time against its prediction, per network setting.

The experiment runner calls this with the bench JSON of every [network] setting (hosts x
ranks per host x link). It tabulates, per setting and method, what the step pays for
communication (the sync call for a method that syncs after backward; the exposed time,
step minus the no-sync step, for one that overlaps backward), what the model predicts,
the relative error, and whether that error is within the lab's targets (±20% for methods
that sync after backward, ±30% for the exposed time of overlapped ones); a prediction within
the bench's noise of its measurement is not judged (noise.NOISE_RULE). Two plots show
the same figures: sync time against the number of ranks, one panel per link rate and
number of hosts, and against the link rate, one panel per layout; measured points are
markers, the model's predictions are lines; their title says when a calibration behind the
lines fitted its own points worse than noise.FIT_ERROR_ROUGH.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..benchmark.contenders import NO_SYNC
from ..files import write_figure
from ..netmodel.links import UNLIMITED, rate_bytes_per_s
from ..sync import PARAMETERS, SYNC_METHODS, label, split_label
from ..sync.averaging import DEFAULT_PERIOD
from ..sync.base import INSIDE_FSDP
from .compare_plots import bench_fit_error
from .finished_jobs import summary_step_times
from .noise import NOISE_FLOOR_S, NOISE_SPREADS, fit_note, noise_bound, spread, within_noise

TARGETS = {False: 0.20, True: 0.30}  # the largest |error| the model may make: after backward, overlapped (exposed)
MARKERS = ("o", "s", "^", "D", "v", "P")  # one per compression: none, then in order of appearance
COLUMNS = ("method", "np", "hosts", "per_host", "link", "measured_ms", "predicted_ms", "error", "target")


def rows_of(results: Sequence[dict]) -> list[dict]:
    """One row per (setting, method) with a prediction, from bench JSONs (python -m mpi_train bench --json)."""
    rows = []
    for result in results:
        layout = result.get("layout") or {}
        for method in result["methods"]:
            if method.get("predicted_s") is None or method.get("measured_s") is None:
                continue
            overlapped = bool(method.get("overlapped"))
            error = method.get("prediction_error")
            noisy = within_noise(method["predicted_s"], method["measured_s"], bench_spread(result, method["method"]))
            rows.append({
                "method": method["method"], "np": result["world_size"], "hosts": layout.get("hosts", 1),
                "per_host": layout.get("ranks_per_host", result["world_size"]),
                "link": result.get("network_link") or UNLIMITED, "overlapped": overlapped,
                "measured_as": ("" if not overlapped else  # what the bench held the prediction against
                                "after backward" if method.get("after_backward_s") is not None else "exposed"),
                "measured_s": method["measured_s"], "predicted_s": method["predicted_s"], "error": error,
                "noisy": noisy, "within": None if error is None or noisy else abs(error) <= TARGETS[overlapped],
            })
    return sorted(rows, key=lambda r: (_rate_order(r["link"]), r["hosts"], r["np"], r["method"]))


def _rate_order(link: str) -> float:
    """Fastest first: unlimited, then by decreasing rate."""
    rate = rate_bytes_per_s(link)
    return -math.inf if rate is None else -rate


def format_table(rows: list[dict]) -> str:
    def cell(row: dict, column: str) -> str:
        if column == "measured_ms":
            return f"{1000 * row['measured_s']:.1f}" + (f" ({row['measured_as']})" if row["measured_as"] else "")
        if column == "predicted_ms":
            return f"{1000 * row['predicted_s']:.1f}"
        if column == "error":
            return "-" if row["error"] is None else f"{100 * row['error']:+.0f}%"
        if column == "target":
            bound = f"±{100 * TARGETS[row['overlapped']]:.0f}%"
            if row["noisy"]:
                return "within noise"
            return "-" if row["within"] is None else f"{bound} {'met' if row['within'] else 'MISSED'}"
        return str(row[column])

    cells = [list(COLUMNS)] + [[cell(row, c) for c in COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) if i in (0, 4, 8) else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdict(rows: list[dict], hosts_at_least: int = 2) -> str:
    """How many predictions are within their target, counting settings that span hosts (the lab's targets); those
    within the noise are counted apart, unjudged."""
    lines = []
    for overlapped, what in ((False, "sync after backward"), (True, "exposed time of overlapped methods")):
        mine = [r for r in rows if r["overlapped"] == overlapped and r["hosts"] >= hosts_at_least]
        judged = [r for r in mine if r["within"] is not None]
        noisy = sum(1 for r in mine if r["noisy"])
        parts = []
        if judged:
            met = [r for r in judged if r["within"]]
            worst = max(judged, key=lambda r: abs(r["error"]))
            parts.append(f"{len(met)} of {len(judged)} predictions within ±{100 * TARGETS[overlapped]:.0f}% on "
                         f"{hosts_at_least}+ hosts (worst: {worst['method']} at np {worst['np']} on "
                         f"{worst['hosts']} host(s), {worst['link']}: {100 * worst['error']:+.0f}%)")
        if noisy:
            parts.append(f"{noisy} within noise, not judged")
        if parts:
            lines.append(f"{what}: " + "; ".join(parts))
    return "\n".join(lines)


def report(results: Sequence[dict]) -> str | None:
    """The table and the verdict, or None when no bench gave a prediction (one rank, no calibration)."""
    rows = rows_of(results)
    if not rows:
        return None
    return ("Sync time per step, measured by the bench (medians; exposed time for methods that overlap backward) "
            "against the alpha-beta model (mpi_train/netmodel/), per network setting; error = (predicted - measured) "
            f"/ measured, not judged within noise (a difference under max({1000 * NOISE_FLOOR_S:.0f} ms, "
            f"{NOISE_SPREADS} x its standard deviation over the bench's steps)):\n"
            + format_table(rows) + "\n" + verdict(rows))


def plot_note(results: Sequence[dict]) -> str | None:
    """What the plots say on their face about the calibrations behind the model's lines (noise.fit_note): the
    worst fit of any bench that predicted."""
    fits = [bench_fit_error(result) for result in results if any(m.get("predicted_s") for m in result["methods"])]
    return fit_note(None if None in fits else max(fits, default=None))


@dataclass(frozen=True)
class Looks:
    """Colour by schedule, marker by compression: one look per method in every panel and in the shared legend."""

    methods: list[str]
    schedules: list[str]
    compressions: list[str]
    colours: dict[str, tuple]
    markers: dict[str, str]

    @classmethod
    def of(cls, rows: list[dict]) -> Looks:
        import matplotlib.pyplot as plt  # here, not at the top: slow to load, and plot() picks its backend first

        methods = list(dict.fromkeys(r["method"] for r in rows))
        schedules = list(dict.fromkeys(split_label(m)[0] for m in methods))
        compressions = list(dict.fromkeys(split_label(m)[1] for m in methods))
        colour_map = plt.get_cmap("tab10" if len(schedules) <= 10 else "tab20")
        return cls(methods=methods, schedules=schedules, compressions=compressions,
                   colours={s: colour_map(i % 20) for i, s in enumerate(schedules)},
                   markers={c: MARKERS[i % len(MARKERS)] for i, c in enumerate(compressions)})

    def style(self, method: str) -> dict:
        schedule, compression = split_label(method)
        return {"color": self.colours[schedule], "marker": self.markers[compression]}

    def draw(self, ax, mine: list[dict], x_of, xlabel: str, title: str) -> None:
        """Each method's measured points as markers, the model's predictions as a dashed line through them."""
        for method in self.methods:
            points = sorted((r for r in mine if r["method"] == method), key=x_of)
            if not points:
                continue
            xs = [x_of(r) for r in points]
            ax.plot(xs, [1000 * r["predicted_s"] for r in points], color=self.style(method)["color"], linestyle="--",
                    linewidth=1, alpha=0.7)
            ax.plot(xs, [1000 * r["measured_s"] for r in points], linestyle="none", markersize=6, **self.style(method))
        ax.set(xlabel=xlabel, ylabel="sync per step (ms; exposed if overlapped)", title=title, yscale="log")
        ax.grid(True, which="both", alpha=0.3)

    def legend(self, fig) -> tuple:
        """One legend for every panel, under them: colour = schedule, marker = compression; returns the rect the
        panels keep."""
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=self.colours[s], marker="o", linestyle="--", linewidth=1, label=s)
                   for s in self.schedules]
        if len(self.compressions) > 1:
            handles += [Line2D([], [], color="grey", marker=self.markers[c], linestyle="none",
                               label=f"+{c}" if c != "none" else "uncompressed") for c in self.compressions]
        columns = min(len(handles), 7)
        fig.legend(handles=handles, loc="lower center", ncol=columns, fontsize=8)
        return (0, 0.35 * math.ceil(len(handles) / columns) / fig.get_size_inches()[1], 1, 0.95)


def panel_grid(count: int):
    """Panels three to a row; the figure and its axes in reading order."""
    import matplotlib.pyplot as plt  # here, not at the top: as Looks.of

    columns = min(3, count)
    rows_of_panels = math.ceil(count / columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(max(8, 5 * columns), 4 * rows_of_panels),
                             squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def finish(fig, looks: Looks, text: str, note: str | None, path: Path) -> Path:
    """The shared legend, the title (the calibrations' note under it, in red, when a fit was rough), saved."""
    rect = looks.legend(fig)
    fig.suptitle(text + (f"\n{note}" if note else ""), color="firebrick" if note else "black")
    return write_figure(fig, path, rect)


def against_ranks(rows: list[dict], looks: Looks, note: str | None, out: Path) -> list[Path]:
    """sync_vs_ranks.png: one panel per link rate and number of hosts, where some panel has several rank counts."""
    panels = sorted({(r["link"], r["hosts"]) for r in rows}, key=lambda panel: (_rate_order(panel[0]), panel[1]))
    if not any(len({r["np"] for r in rows if (r["link"], r["hosts"]) == panel}) > 1 for panel in panels):
        return []
    fig, axes = panel_grid(len(panels))
    for ax, (link, hosts) in zip(axes, panels):
        mine = [r for r in rows if (r["link"], r["hosts"]) == (link, hosts)]
        looks.draw(ax, mine, lambda r: r["np"], "ranks (np)", f"{hosts} host(s), link {link}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["np"] for r in mine}), [str(n) for n in sorted({r["np"] for r in mine})])
    return [finish(fig, looks, "Sync time against ranks: measured (markers) and the alpha-beta model (dashed)", note,
                   out / "sync_vs_ranks.png")]


def against_links(rows: list[dict], looks: Looks, note: str | None, out: Path) -> list[Path]:
    """sync_vs_link.png: one panel per layout over several hosts that was run at more than one link rate."""
    layouts = sorted({(r["hosts"], r["per_host"]) for r in rows if r["hosts"] > 1})
    layouts = [l for l in layouts if len({r["link"] for r in rows if (r["hosts"], r["per_host"]) == l}) > 1]
    if not layouts:
        return []
    fig, axes = panel_grid(len(layouts))
    for ax, (hosts, per_host) in zip(axes, layouts):
        mine = [r for r in rows if (r["hosts"], r["per_host"]) == (hosts, per_host)]
        looks.draw(ax, mine, lambda r: 8 * rate_bytes_per_s(r["link"]) / 1e6, "each host's link rate (log scale)",
                   f"np {hosts * per_host}: {hosts} hosts x {per_host}")
        ax.set_xscale("log")
        links = sorted({r["link"] for r in mine}, key=_rate_order)
        ax.set_xticks([8 * rate_bytes_per_s(link) / 1e6 for link in links], links)
    return [finish(fig, looks, "Sync time against link rate: measured (markers) and the alpha-beta model (dashed)",
                   note, out / "sync_vs_link.png")]


def plot(results: Sequence[dict], out: Path) -> list[Path]:
    """sync_vs_ranks.png and sync_vs_link.png under `out` (those the settings allow)."""
    import matplotlib

    matplotlib.use("Agg")
    rows = rows_of(results)
    if not rows:
        return []
    out.mkdir(parents=True, exist_ok=True)
    looks, note = Looks.of(rows), plot_note(results)
    return against_ranks(rows, looks, note, out) + against_links(rows, looks, note, out)


def timeline_report(summaries: dict[str, dict]) -> str | None:
    """Per message of the runs recorded with --timeline (a bucket, a tensor or the one buffer, in the order sent):
    its measured duration and end after backward (medians over the window, rank 0) beside the model's, started from
    when the gradients were really ready; the rows where they part by more than the targets are marked."""
    lines = []
    for name, summary in sorted(summaries.items()):
        rows = (summary.get("timeline") or {}).get("messages") or []
        if not rows:
            continue
        lines.append(f"{name} (steps {'-'.join(map(str, summary['timeline']['steps']))}):")
        lines.append(f"  {'message':>7} {'measured_ms':>12} {'model_ms':>9} {'end_after_backward_ms':>22} "
                     f"{'model_end_ms':>13}  verdict")
        for row in rows:
            if "predicted_s" not in row:
                lines.append(f"  {row['message']:>7} {1000 * row['measured_s']:>12.1f} {'-':>9}")
                continue
            error = (row["predicted_s"] - row["measured_s"]) / row["measured_s"] if row["measured_s"] > 0 else 0.0
            verdict = "ok" if abs(error) <= TARGETS[True] else f"parts: {100 * error:+.0f}%"
            lines.append(f"  {row['message']:>7} {1000 * row['measured_s']:>12.1f} {1000 * row['predicted_s']:>9.1f} "
                         f"{1000 * row['measured_end_after_backward_s']:>22.1f} "
                         f"{1000 * row['predicted_end_after_backward_s']:>13.1f}  {verdict}")
    if not lines:
        return None
    return ("Messages of the runs recorded with --timeline, measured (rank 0, medians over the window) against the "
            "alpha-beta model started from the measured gradient times; end after backward > 0 is exposed:\n"
            + "\n".join(lines))


EXPOSED_TARGET = 0.15  # a run's own exposed communication against the bench's, same method and setting


def bench_spread(bench: dict, method: str) -> float | None:
    """How far a method's exposed time strays between a bench's timed steps: the standard deviation of its step minus
    the no-sync step (slowest rank per step, as the bench takes its medians); None without per-step times."""
    per_rank = bench.get("per_rank_times") or []
    if not per_rank or any(method not in rank or NO_SYNC not in rank for rank in per_rank):
        return None
    steps = [max(values) for values in zip(*(rank[method]["step"] for rank in per_rank))]
    baseline = [max(values) for values in zip(*(rank[NO_SYNC]["step"] for rank in per_rank))]
    return spread([a - b for a, b in zip(steps, baseline)])


def exposed_verdict(run_s: float, bench_s: float, run_spread: float | None, bench_noise: float | None) -> str:
    """ok, `parts: +N%`, or `within noise (±N ms)` where the two differ by less than the noise (noise.NOISE_RULE).
    A bench's exposed time below zero is its noise (the no-sync step was the slower): it counts as a spread of its
    size, and a difference it explains gets no verdict."""
    noise = [run_spread, bench_noise, -bench_s if bench_s < 0 else None]
    if within_noise(run_s, bench_s, *noise):
        return f"within noise (±{1000 * noise_bound(*noise):.0f} ms)"
    error = (run_s - bench_s) / bench_s
    return "ok" if abs(error) <= EXPOSED_TARGET else f"parts: {100 * error:+.0f}%"


def averaging_period(config: dict) -> int:
    """Steps between a run's syncs: a model-averaging method's --period (localsgd, diloco), 1 for the others."""
    method = SYNC_METHODS.get(config.get("sync", ""))
    if method is None or method.traits.averages != PARAMETERS:
        return 1
    return int(config.get("period") or DEFAULT_PERIOD)


def inside_forward(config: dict) -> bool:
    """A method whose messages run inside forward and backward (fsdp's gathers): the run's sync split times only
    what follows backward, the bench's exposed time all of it, so the two do not measure one figure."""
    method = SYNC_METHODS.get(config.get("sync", ""))
    return method is not None and method.traits.sends == INSIDE_FSDP


def exposed_report(pairs: Sequence[tuple[str, dict, dict]]) -> str | None:
    """Each training run's exposed communication, measured in the run itself (the sync split's steady-state mean:
    what backward did not hide, wait included), beside the bench's exposed time (step minus a no-sync replica's) for
    the same method on the same setting: one figure measured two ways, judged only beyond the noise of both. `pairs`
    are (run name, its summary, the bench JSON of its setting)."""
    lines = []
    for name, summary, bench in pairs:
        split = (summary.get("sync_split_after_warmup") or {}).get("mean")
        config = summary.get("config") or {}
        method = label(config.get("sync", ""), config.get("compression", "none"))
        row = next((m for m in bench["methods"] if m["method"] == method), None)
        if not split or row is None or row.get("exposed_s") is None:
            continue
        run_s, bench_s, noise = split["exposed_comm_s"], row["exposed_s"], bench_spread(bench, method)
        every = averaging_period(config)
        if every > 1:  # the bench averages every step: a run pays it every `every` steps
            bench_s, noise = bench_s / every, None if noise is None else noise / every
        timed = summary.get("total_steps", 0) - summary.get("timing_warmup_steps", 1)
        if inside_forward(config):
            verdict = "not compared: its gathers run in forward and backward, which the run's sync split leaves out"
        elif every > 1 and timed < every:
            verdict = f"not compared: no average in its {timed} timed steps (one every {every})"
        else:
            verdict = exposed_verdict(run_s, bench_s, spread(summary_step_times(summary)), noise)
        lines.append(f"  {name:<36} {method:<18} {1000 * run_s:>10.1f} {1000 * split['sync_wait_s']:>8.1f} "
                     f"{100 * split['comm_overlap']:>9.0f}% {1000 * bench_s:>9.1f}  {verdict}")
    if not lines:
        return None
    head = f"  {'run':<36} {'method':<18} {'run_ms':>10} {'wait_ms':>8} {'overlap':>10} {'bench_ms':>9}  verdict"
    return (f"Exposed communication per step, measured inside each training run (steady-state mean over ranks, wait "
            f"for the last rank included; overlap = share of message time during backward) against the bench's "
            f"exposed time for the same method and setting (a model-averaging method's per step: one average over "
            f"its period; target ±{100 * EXPOSED_TARGET:.0f}%, judged only beyond the noise; a bench figure below "
            f"zero is its noise):\n"
            + head + "\n" + "\n".join(lines))
