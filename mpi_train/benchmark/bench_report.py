"""The bench's table, with its setting above it and its notes under it, as printed and stored."""

from __future__ import annotations

import math

from .. import netmodel
from ..outputs.text_table import text_table
from ..step.precision import UNNAMED_PRECISION
from .calibration import CALIBRATED_COLLECTIVES
from .contenders import NO_SYNC

COLUMNS = ("method", "family", "S_MB", "compute_ms", "sync_ms", "exposed_ms", "±ms", "after_bwd_ms", "sent_MB",
           "recv_MB", "busbw_GB/s", "floor_ms", "efficiency", "predicted_ms", "pred_err", "codec_ms", "codec_bwd_ms")


def format_table(rows: list[dict]) -> str:
    def cell(row: dict, column: str) -> str:
        scale = {"compute_ms": ("compute_s", 1e3), "sync_ms": ("sync_s", 1e3), "exposed_ms": ("exposed_s", 1e3),
                 "±ms": ("noise_s", 1e3), "floor_ms": ("floor_s", 1e3), "busbw_GB/s": ("busbw_bytes_per_s", 1e-9),
                 "efficiency": ("efficiency", 1), "predicted_ms": ("predicted_s", 1e3),
                 "pred_err": ("prediction_error", 100), "codec_ms": ("codec_s", 1e3),
                 "after_bwd_ms": ("after_backward_s", 1e3), "codec_bwd_ms": ("codec_backward_s", 1e3)}
        if column == "method":
            return row["method"]
        if column == "family":
            return row["collective"] or ("-" if row["method"] == NO_SYNC else "n/a")
        if column == "S_MB":
            return "-" if row.get("wire_bytes") is None else f"{row['wire_bytes'] / 1e6:.2f}"
        if column in ("sent_MB", "recv_MB"):
            values = row["sent_bytes" if column == "sent_MB" else "received_bytes"]
            if values is None:
                return "-"
            low, high = min(values) / 1e6, max(values) / 1e6  # rank 0 may move more than the rest
            digits = 1 if high >= 10 else 2
            if math.isclose(low, high):
                return f"{high:.{digits}f}"
            return f"{high:.{digits}f} ({'r0' if values[0] == high else 'max'}) / {low:.{digits}f}"
        key, factor = scale[column]
        value = row.get(key)
        if column == "efficiency" and row.get("overlapped"):
            return "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        if column == "pred_err":
            return f"{value * factor:+.0f}%"
        noise = row.get("after_backward_noise_s") if column == "after_bwd_ms" else None
        if noise is not None and math.isfinite(noise):
            return f"{value * factor:.1f} ±{noise * factor:.1f}"
        return f"{value * factor:.2f}" if column in ("efficiency", "busbw_GB/s") else f"{value * factor:.1f}"

    cells = [list(COLUMNS)] + [[cell(row, c) for c in COLUMNS] for row in rows]
    return text_table(cells)


def describe(result: dict) -> str:
    """The table with the setting above it and notes under it, as printed and stored."""
    link = result["link"]
    calibration = result.get("calibration")
    layout = result.get("layout")
    lines = [
        f"sync cost: {result['world_size']} rank(s)"
        + (f" on {layout['hosts']} host(s), {layout['ranks_per_host']} per host" if layout else "")
        + (f", link {result['network_link']}" if result.get("network_link") else "")
        + f", backend {result['backend']}, {result.get('precision', UNNAMED_PRECISION)}, "
        f"{result.get('model_described', result['model'])} "
        f"({result['gradient_bytes'] / 1e6:.1f} MB of gradients), batch {result['batch_size']}, "
        f"{result['steps']} timed steps per method (medians, slowest rank per step)",
        f"link bandwidth B = {link['bandwidth_bytes_per_s'] / 1e9:.3f} GB/s "
        f"({link.get('measured_by', 'ping-pong rank 0 <-> 1')}); "
        f"allreduce bus bandwidth {link['allreduce_busbw_bytes_per_s'] / 1e9:.3f} GB/s"
        if result["world_size"] > 1 else "one rank: no link to measure, floors are zero",
    ]
    if calibration:
        lines.append("calibration (alpha + beta·m, least squares over 1 KB .. S): "
                     + netmodel.describe_network(netmodel.Network.from_dict(calibration["network"])))
        for name in CALIBRATED_COLLECTIVES:
            fit = calibration.get(name)
            if fit:
                lines.append(f"{name} of m bytes on all {result['world_size']} ranks: {fit['alpha'] * 1e3:.2f} ms + "
                             f"m / {1 / fit['beta'] / 1e6 if fit['beta'] else math.inf:,.0f} MB/s "
                             f"(fit error {100 * fit['fit_error']:.0f}%)")
    lines.append(format_table(result["methods"]))
    missing = [row["method"] for row in result["methods"] if row["method"] != NO_SYNC and row["collective"] is None]
    if missing:
        lines.append(f"n/a: {', '.join(missing)} declare(s) no collective family (mpi_train/netmodel/families.py), "
                     f"so bytes and floor are not shown; declare its `family` in the class's traits "
                     f"(mpi_train/sync/traits.py).")
    for name, why in result.get("unavailable", []):
        lines.append(f"unavailable: {name}: {why}")
    lines.append("S = bytes summed per step as the method sends them (cost model's S); "
                 "exposed = step minus the no-sync step in the same round (± half its interquartile range over steps: "
                 "the machine's noise); after_bwd = an overlapped method's sync on the rank that finished backward "
                 "last (what its backward did not hide, ± as for exposed; none for ddp's, which wait inside "
                 "backward); "
                 "efficiency = floor / sync (at most 1; n/a where communication overlaps backward); predicted = the "
                 "alpha-beta model's wire time (mpi_train/netmodel/) plus codec (an overlapped method's placed "
                 "between its sums, as its sync runs it), pred_err against sync, against "
                 "after_bwd for overlapped methods (exposed for ddp's); codec = the compressor's own CPU work per "
                 "step after backward, codec_bwd its work inside backward (which lengthens compute).")
    return "\n".join(lines)
