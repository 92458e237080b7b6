"""The network lab's report: predicted against measured per setting, the targets judged, the plots drawn."""

import pytest

from mpi_train.analysis import model_accuracy


def bench(np, hosts, link, methods):
    """The part of a bench JSON the report reads: (label, overlapped, measured s, predicted s) per method."""
    return {"world_size": np, "layout": {"hosts": hosts, "ranks_per_host": np // hosts}, "network_link": link,
            "methods": [{"method": "no-sync"}] + [
                {"method": name, "overlapped": overlapped, "measured_s": measured, "predicted_s": predicted,
                 "prediction_error": (predicted - measured) / measured}
                for name, overlapped, measured, predicted in methods]}


RESULTS = [
    bench(2, 2, "1gbit", [("ring", False, 0.30, 0.29), ("ddp", True, 0.10, 0.12)]),
    bench(4, 2, "1gbit", [("ring", False, 0.45, 0.30), ("ddp", True, 0.20, 0.25)]),
    bench(4, 2, "100mbit", [("ring", False, 4.5, 4.4), ("ddp", True, 4.0, 4.1)]),
    bench(4, 1, "unlimited", [("ring", False, 0.05, 0.01)]),  # one host: shown, not judged
]


def test_each_prediction_is_judged_against_its_own_target():
    rows = model_accuracy.rows_of(RESULTS)
    assert [(r["link"], r["np"], r["method"]) for r in rows][:3] == [("unlimited", 4, "ring"), ("1gbit", 2, "ddp"),
                                                                     ("1gbit", 2, "ring")]
    within = {(r["method"], r["np"], r["link"]): r["within"] for r in rows}
    assert within[("ring", 4, "1gbit")] is False  # -33%: outside ±20%
    assert within[("ddp", 4, "1gbit")] is True  # +25%: inside ±30% for an overlapped method
    assert within[("ring", 2, "1gbit")] is True
    text = model_accuracy.report(RESULTS)
    assert "sync after backward: 2 of 3 predictions within ±20%" in text
    assert "worst: ring at np 4 on 2 host(s), 1gbit: -33%" in text
    assert "exposed time of overlapped methods: 3 of 3" in text
    assert "MISSED" in text and "(exposed)" in text and "(after backward)" not in text
    waited = bench(4, 2, "1gbit", [("bucketed", True, 0.20, 0.21)])  # waits in its sync: held against that wait
    waited["methods"][1]["after_backward_s"] = 0.20
    assert "200.0 (after backward)" in model_accuracy.report([waited])


def test_a_bench_without_predictions_gives_no_report(tmp_path):
    one_rank = [{"world_size": 1, "methods": [{"method": "no-sync"}, {"method": "ring", "predicted_s": None}]}]
    assert model_accuracy.report(one_rank) is None and model_accuracy.plot(one_rank, tmp_path) == []


def test_the_plots_show_ranks_and_link_rates(tmp_path):
    compressed = [bench(4, 2, link, [("ring+fp16", False, 0.2, 0.18)]) for link in ("1gbit", "100mbit")]
    paths = model_accuracy.plot(RESULTS + compressed, tmp_path)  # colour by schedule, marker by compression
    assert [p.name for p in paths] == ["sync_vs_ranks.png", "sync_vs_link.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_the_timeline_s_messages_are_held_against_the_model_and_a_parting_one_is_marked():
    summary = {"timeline": {"steps": [3, 6], "messages": [
        {"message": 0, "measured_s": 0.010, "measured_end_after_backward_s": -0.002, "predicted_s": 0.011,
         "predicted_end_after_backward_s": -0.001},
        {"message": 1, "measured_s": 0.020, "measured_end_after_backward_s": 0.015, "predicted_s": 0.005,
         "predicted_end_after_backward_s": 0.004}]}}
    text = model_accuracy.timeline_report({"bucketed-np4": summary, "flat-np4": {"steps": []}})
    rows = [line.split() for line in text.splitlines() if line.startswith("  ") and line.split()[0].isdigit()]
    assert [row[-1] for row in rows] == ["ok", "-75%"] and "bucketed-np4 (steps 3-6):" in text
    assert "flat-np4" not in text and model_accuracy.timeline_report({"x": {}}) is None


def test_a_runs_own_exposed_time_is_held_against_the_bench_of_its_method_and_setting():
    def summary(sync, exposed):
        return {"config": {"sync": sync, "compression": "none"},
                "sync_split_after_warmup": {"mean": {"exposed_comm_s": exposed, "sync_wait_s": 0.01,
                                                     "comm_overlap": 0.8}}}

    bench = {"methods": [{"method": "ddp", "exposed_s": 0.100}, {"method": "bucketed", "exposed_s": 0.200}]}
    text = model_accuracy.exposed_report([("ddp-run", summary("ddp", 0.110), bench),
                                          ("bucketed-run", summary("bucketed", 0.150), bench),
                                          ("ring-run", summary("ring", 0.3), bench)])  # no bench row: left out
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and "-run" in line}
    assert rows["ddp-run"].endswith("ok") and "110.0" in rows["ddp-run"] and "80%" in rows["ddp-run"]
    assert rows["bucketed-run"].endswith("parts: -25%") and "ring-run" not in rows
    assert model_accuracy.exposed_report([("ring-run", summary("ring", 0.3), bench)]) is None


def test_an_exposed_time_within_noise_gets_no_verdict_and_a_real_miss_still_does():
    # the figures of a 4-step smoke run: a few ms apart, or against a bench figure below zero
    assert model_accuracy.exposed_verdict(0.0015, 0.0010, None, None) == "within noise (±5 ms)"  # under the floor
    assert model_accuracy.exposed_verdict(0.0045, -0.0408, None, None) == "within noise (±82 ms)"  # the bench's noise
    assert model_accuracy.exposed_verdict(0.0235, 0.0101, 0.008, None) == "within noise (±16 ms)"  # the run's steps
    assert model_accuracy.exposed_verdict(0.0235, 0.0101, None, 0.002) == "parts: +133%"  # quiet: a real miss
    assert model_accuracy.exposed_verdict(0.250, 0.240, 0.002, 0.002) == "ok"  # 10 ms beyond the noise, +4%


def test_the_bench_spread_is_over_its_steps_of_the_slowest_rank():
    rank = {"no-sync": {"step": [0.030, 0.032, 0.031]}, "ring": {"step": [0.040, 0.062, 0.051]}}
    quiet = {"no-sync": {"step": [0.029, 0.031, 0.030]}, "ring": {"step": [0.039, 0.061, 0.050]}}
    bench = {"per_rank_times": [rank, quiet], "methods": []}
    assert model_accuracy.bench_spread(bench, "ring") == pytest.approx(0.010)  # differences 10, 30, 20 ms
    assert model_accuracy.bench_spread(bench, "flat") is None and model_accuracy.bench_spread({}, "ring") is None


def test_the_lab_does_not_judge_a_prediction_within_the_bench_s_noise():
    noisy = bench(4, 2, "1gbit", [("ring", False, 0.012, 0.009), ("flat", False, 0.450, 0.300)])
    rows = {r["method"]: r for r in model_accuracy.rows_of([noisy])}
    assert rows["ring"]["noisy"] and rows["ring"]["within"] is None
    assert rows["flat"]["within"] is False  # -33%, 150 ms: a real miss
    text = model_accuracy.report([noisy])
    assert "within noise" in text and "MISSED" in text
    assert "sync after backward: 0 of 1 predictions within ±20%" in text and "1 within noise, not judged" in text


def test_the_lab_s_plots_say_when_a_calibration_fits_badly(tmp_path):
    from PIL import Image

    rough = [dict(result, calibration={"network": {"intra": {"fit_error": 0.05}, "inter": {"fit_error": 0.34}}})
             for result in RESULTS]
    paths = model_accuracy.plot(rough, tmp_path)
    assert [p.name for p in paths] == ["sync_vs_ranks.png", "sync_vs_link.png"]
    for path in paths:
        assert "model fit error 34% (over 20%): predictions are rough" in Image.open(path).text["Title"]
    fine = [dict(result, calibration={"network": {"intra": {"fit_error": 0.05}, "inter": {"fit_error": 0.1}}})
            for result in RESULTS]
    assert model_accuracy.plot_note(fine) is None
    assert model_accuracy.plot_note(RESULTS) == "model fit error not recorded: predictions unchecked"


def test_a_model_average_is_held_against_the_bench_once_a_period_and_fsdp_is_not_compared():
    def summary(sync, exposed, steps, period=None):
        return {"config": {"sync": sync, "compression": "none", "period": period}, "total_steps": steps,
                "timing_warmup_steps": 1,
                "sync_split_after_warmup": {"mean": {"exposed_comm_s": exposed, "sync_wait_s": 0.0,
                                                     "comm_overlap": 0.0}}}

    bench = {"methods": [{"method": "localsgd", "exposed_s": 0.800}, {"method": "fsdp", "exposed_s": 0.050}]}
    text = model_accuracy.exposed_report([("short", summary("localsgd", 0.0, 4), bench),
                                          ("long", summary("localsgd", 0.210, 41, period=4), bench),
                                          ("sharded", summary("fsdp", 0.0001, 41), bench)])
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and line.split()[0] != "run"}
    assert rows["short"].endswith("not compared: no average in its 3 timed steps (one every 8)")  # the default period
    assert "200.0  ok" in rows["long"]  # one 800 ms average every 4 steps: 200 ms a step, 5% off the run's
    assert "not compared: its gathers run in forward and backward" in rows["sharded"]
