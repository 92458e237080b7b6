"""The advice's figure: the predicted step against bucket size, and every measured step."""

from __future__ import annotations

from pathlib import Path

from ..advice import search
from ..files import write_figure


def plot(result: dict, path: Path) -> Path:
    """Predicted step against bucket size for each method that follows --bucket-mb, the other methods' predictions
    as lines, and every measured step as a point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["candidates"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axis = plt.subplots(figsize=(9, 5.5))
    for index, name in enumerate(result["search"]["bucket_tuned"]):
        color = colors[index % len(colors)]
        curve = sorted((row["bucket_mb"], row["predicted_step_s"]) for row in rows if row["sync"] == name)
        axis.plot([x for x, _ in curve], [1e3 * y for _, y in curve], color=color, drawstyle="steps-pre",
                  label=f"{name}: predicted")
        measured = [(row["bucket_mb"], row["measured_step_s"]) for row in rows
                    if row["sync"] == name and row["measured_step_s"] is not None]
        axis.scatter([x for x, _ in measured], [1e3 * y for _, y in measured], color=color, marker="o", zorder=3,
                     label=f"{name}: measured")
    others = [row for row in rows if row["bucket_mb"] is None]
    for index, row in enumerate(others, len(result["search"]["bucket_tuned"])):  # a line each, measured at the right
        color = colors[index % len(colors)]
        axis.axhline(1e3 * row["predicted_step_s"], color=color, linestyle=("--", "-.", ":")[index % 3], linewidth=1,
                     label=f"{row['label']}: predicted")
        if row["measured_step_s"] is not None:
            axis.scatter([result["search"]["bucket_sizes_mb"][-1]], [1e3 * row["measured_step_s"]], color=color,
                         marker="s", zorder=3, label=f"{row['label']}: measured")
    axis.axvline(search.DEFAULT_BUCKET_MB, color="grey", linewidth=0.8, linestyle=":")
    axis.set(xscale="log", xlabel="bucket size (MB)", ylabel="step (ms)",
             title=f"{result['model']}, batch {result['batch_size']}, {result['world_size']} ranks: recommended "
                   f"{' '.join(result['recommended']['flags'])}")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=7, ncol=2)
    return write_figure(fig, path)
