"""The whole-job figures a finished job's parent run carries under `summary/` (names.py)."""

from __future__ import annotations

import statistics

from . import names


def job_metrics(summary: dict, global_batch: int) -> dict:
    """The whole-job figures of a finished job's summary, under the parent run's `summary/` names (names.py):
    one steady-state mean per phase (names.SUMMARY_RULE), and the run's outcome. Samples/s counts what a step
    trained on, where the summary says (a training set smaller than `global_batch`), else the global batch."""
    steady = summary.get("mean_times_after_warmup") or summary["mean_times"]
    step_s = steady["step_time_s"]
    samples = summary.get("samples_per_step", global_batch)
    figures = {
        **{names.summary_key(phase): value for phase, value in steady.items()},
        names.summary_key("samples_per_s"): samples / step_s if step_s else 0.0,
        names.summary_key("sync_share"): steady["sync_time_s"] / step_s if step_s else 0.0,
        names.summary_key("total_steps"): summary["total_steps"],
        names.summary_key("wall_time_s"): summary["wall_time_s"],
        **({names.COMPILE_TIME: summary["compile_s"]} if summary.get("compile_s") is not None else {}),
    }
    if summary["final_loss"] is not None:
        figures[names.summary_key("final_loss")] = summary["final_loss"]
    if summary.get("epochs"):
        figures[names.summary_key("test_accuracy")] = summary["epochs"][-1]["test_accuracy"]
        figures[names.summary_key("test_loss")] = summary["epochs"][-1]["test_loss"]
    figures.update({names.summary_key(key): value for key, value in summary.get("throughput", {}).items()
                    if key in names.THROUGHPUT})
    if "predicted_sync_time_s" in summary:
        figures[names.summary_key("predicted_sync_s")] = summary["predicted_sync_time_s"]
    if "prediction_fit_error" in summary:  # the worst calibration fit behind it (a compared plot says when rough)
        figures[names.summary_key("prediction_fit_error")] = summary["prediction_fit_error"]
    split = summary.get("sync_split_after_warmup")
    if split:
        figures.update({names.summary_key(key): split["mean"][key] for key in names.SPLIT})
        figures[names.summary_key("slowest_rank")] = split["slowest_rank"]
    if summary.get("recorder_busy_s"):  # the split's own cost (and a timeline's), as tracking_share is tracking's
        loop_s = summary["mean_times"]["step_time_s"] * summary["total_steps"]
        busy_s = statistics.fmean(summary["recorder_busy_s"])
        figures[names.summary_key("recorder_share")] = busy_s / loop_s if loop_s else 0.0
    shown = summary.get("timeline") or {}
    if shown.get("wire_s_per_step"):  # every collective's time on the wire, the timeline's steps: beside the model's
        figures[names.summary_key("wire_s")] = sum(shown["wire_s_per_step"].values())
        if shown.get("predicted_wire_s_per_step"):
            figures[names.summary_key("predicted_wire_s")] = sum(shown["predicted_wire_s_per_step"].values())
    if summary.get("clock_alignment"):
        figures[names.summary_key("clock_error_s")] = max(rank["error_s"] for rank in summary["clock_alignment"])
    held = summary.get("memory") or {}
    figures.update({names.memory_key(key): value for key, value in held.get("most", {}).items()})
    if held.get("predicted"):
        figures[names.memory_key("predicted_total_bytes")] = held["predicted"]["total_bytes"]
    if summary.get("slow_host"):
        figures[names.summary_key("slow_host_cost_s")] = summary["slow_host"]["cost_s"]
        figures[names.summary_key("slow_host_link_mb_s")] = summary["slow_host"]["bandwidth"] / 1e6
    return figures
