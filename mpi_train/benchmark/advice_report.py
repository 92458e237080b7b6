"""The advice as printed and stored: the setting, the links, the candidates' table, the recommendation, the lossy
options and the full bench's check."""

from __future__ import annotations

from collections.abc import Sequence

from .. import netmodel
from ..advice import cache, search
from ..advice.search import Candidate
from ..memory import size
from ..optimizers import describe_state


def table(rows: Sequence[dict]) -> str:
    columns = ("candidate", "flags", "predicted_ms", "exposed_ms", "measured_ms", "mem_MiB", "binds")

    def cell(row: dict, column: str) -> str:
        if column == "candidate":
            return row["label"]
        if column == "flags":
            return " ".join(row["flags"])
        if column == "binds":
            return row["binds"]
        if column == "mem_MiB":  # memory per rank, predicted (netmodel/memory.py)
            held = row.get("predicted_memory_bytes")
            return "-" if held is None else f"{held / 2**20:,.1f}"
        value = row[{"predicted_ms": "predicted_step_s", "exposed_ms": "predicted_exposed_s",
                     "measured_ms": "measured_step_s"}[column]]
        return "-" if value is None else f"{value * 1e3:,.1f}"

    cells = [list(columns)] + [[cell(row, column) for column in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(value.ljust(width) if i in (0, 1, 6) else value.rjust(width)
                       for i, (value, width) in enumerate(zip(line, widths))).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def describe(result: dict) -> str:
    """The advice as printed and stored: the setting, the links, the table, the recommendation, the lossy options."""
    setting = cache.Setting.of(result)
    links = result["calibration"]
    source = (f"of {links['reused_from']}, measured {cache.age(result['created_s'] - links['measured_at_s'])} before"
              if links.get("reused_from") else "measured now")
    network = netmodel.Network.from_dict(links["network"])
    search_note = result["search"]
    shown = [row for row in result["candidates"] if row["shown"]]
    recommended = result["recommended"]
    lines = [
        f"advice for {setting.describe()}, backend {result['backend']}"
        + (f", link {result['link']}" if result.get("link") else "")
        + f": {result['gradient_bytes'] / 1e6:.1f} MB of gradients in {result['tensors']} tensors",
        f"links ({source}): {netmodel.describe_network(network)}",
        (f"step without sync {result['baseline_step_s'] * 1e3:,.1f} ms (forward + backward "
         f"{result['compute_s'] * 1e3:,.1f} ms in {result.get('precision', cache.UNNAMED_PRECISION)}, backward "
         f"{result['backward_share']:.2f} of it), slowest rank"),
        f"searched {search_note['configurations']} lossless configurations: "
        + ", ".join(search_note["methods"])
        + (f"; {', '.join(search_note['bucket_tuned'])} at {len(search_note['bucket_sizes_mb'])} bucket sizes "
           f"({search_note['bucket_sizes_mb'][0]:g} .. {search_note['bucket_sizes_mb'][-1]:g} MB)"
           if search_note["bucket_tuned"] else ""),
        *([(f"memory per rank at most {size(result['memory_limit_bytes'])} (--memory-limit; the "
            f"model's parameters, gradients and {describe_state(result.get('optimizer', 'sgd'), result['momentum'])}, "
            f"mem_MiB below)")]
          if result.get("memory_limit_bytes") else []),
        "",
        table(shown),
        (f"(each method at its best predicted configuration, and every one measured; measured = the short bench, "
         f"{result['bench']['steps']} timed step(s) after {result['bench']['warmup']} warm-up, slowest rank, median)"),
    ]
    if result.get("kendall_tau") is not None:
        lines.append(f"Kendall's tau between predicted and measured step over the {len(result['measured'])} measured: "
                     f"{result['kendall_tau']:.2f}")
    for name, why in result["unavailable"]:
        lines.append(f"unavailable: {name}: {why}")
    for name, why in result.get("over_memory_limit", []):
        lines.append(f"left out: {name}: {why}")
    lines += ["", f"recommended: {' '.join(recommended['flags'])}",
              (f"  predicted {recommended['predicted_step_s'] * 1e3:,.0f} ms per step, measured "
               f"{recommended['measured_step_s'] * 1e3:,.0f} ms"),
              f"  why: {recommended['why']}", "",
              ("lossy options, never chosen here: each changes what the model learns. Each at its fastest predicted "
               "schedule (the wire only, not a compressor's CPU work; every schedule is in the JSON):")]
    lines += lossy_table(result["lossy"])
    for name, why in result["lossy_unavailable"]:
        lines.append(f"unavailable: {name}: {why}")
    if result.get("full_bench"):
        lines += describe_full_bench(result["full_bench"])
    return "\n".join(lines)


def lossy_table(rows: Sequence[dict]) -> list[str]:
    """Each lossy option at its fastest predicted schedule, with the accuracy cost measured and where (numbered)."""
    fastest: dict[str, dict] = {}
    for row in rows:  # (fastest first)
        fastest.setdefault(row["option"], row)
    sources = list(dict.fromkeys(row["accuracy_measured"] for row in fastest.values() if row["accuracy_measured"]))
    cells = [("option", "flags", "predicted_ms", "accuracy against allreduce")] + [
        (option, " ".join(row["flags"]), f"{row['predicted_step_s'] * 1e3:,.1f}",
         f"{row['accuracy_points']:+.2f} points [{sources.index(row['accuracy_measured']) + 1}]"
         if row["accuracy_measured"] else "not measured") for option, row in fastest.items()]
    widths = [max(len(line[i]) for line in cells) for i in range(4)]
    lines = [f"{a.ljust(widths[0])}  {b.ljust(widths[1])}  {c.rjust(widths[2])}  {d}" for a, b, c, d in cells]
    return lines + [f"  [{number}] {source}" for number, source in enumerate(sources, 1)]


def describe_full_bench(check: dict) -> list[str]:
    """The full bench's table and what it says of the advice."""
    rows = [{**row, "flags": Candidate(row["sync"], row["bucket_mb"]).flags, "predicted_exposed_s": None,
             "binds": ""} for row in check["configurations"]]
    mine = next(row for row in rows if row["label"] == check["recommended"])
    lines = ["", (f"full bench: {len(rows)} lossless configurations, {check['steps']} timed step(s) each, "
                  f"{check['seconds']:.0f} s (no sync {check['no_sync_step_s'] * 1e3:,.0f} ms a step)"),
             table(rows),
             (f"the recommendation, {check['recommended']}, measured {mine['measured_step_s'] * 1e3:,.0f} ms "
              f"here; the fastest, {check['fastest']}, {rows[0]['measured_step_s'] * 1e3:,.0f} ms: regret "
              f"{check['regret']:+.1%}")]
    if check["default_bucket_step_s"] is not None:
        lines.append(f"its bucket size against the default {search.DEFAULT_BUCKET_MB:g} MB: "
                     f"{mine['measured_step_s'] * 1e3:,.0f} against {check['default_bucket_step_s'] * 1e3:,.0f} ms")
    lines.append("Kendall's tau, predicted against measured: "
                 + (f"{check['kendall_tau_methods']:.2f} over the methods ({', '.join(check['methods'])}), "
                    if check["kendall_tau_methods"] is not None else "")
                 + (f"{check['kendall_tau']:.2f} over every configuration" if check["kendall_tau"] is not None
                    else ""))
    return lines
