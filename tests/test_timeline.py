"""The sync split's arithmetic, the clock alignment's estimate, the recorder and the trace's format, in one process;
and, under a real mpirun of four ranks with one made a straggler, what the job logs, prints and traces."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import client_for, job_runs, train_several

from mpi_train.errors import UserError
from mpi_train.failpoints import Slowdown
from mpi_train.outputs.timeline_files import against_model, claim_names
from mpi_train.timeline import (
    Alignment,
    Message,
    Step,
    StepRecorder,
    means,
    offset_from,
    parse_window,
    slowest,
    split,
    step_events,
    trace,
    wire_per_step,
)


def figures(step, arrival, region, comm=0.0, in_backward=0.0):
    return {"step": step, "arrival": arrival, "region": region, "sync": region, "comm": comm,
            "in_backward": in_backward}


def test_the_last_rank_waits_for_nobody_and_the_others_for_it():
    # rank 1 arrives 0.3 s after rank 0; both regions end together at 1.4 s
    ranks = [[figures(1, 1.0, 0.4, comm=0.1)], [figures(1, 1.3, 0.1, comm=0.1)]]
    first, second = split(ranks)
    assert first[0]["sync_wait_s"] == pytest.approx(0.3) and first[0]["sync_transfer_s"] == pytest.approx(0.1)
    assert second[0]["sync_wait_s"] == 0 and second[0]["sync_transfer_s"] == pytest.approx(0.1)
    for rank in (first, second):  # wait + transfer is the region, exactly
        assert rank[0]["sync_wait_s"] + rank[0]["sync_transfer_s"] == pytest.approx(rank[0]["exposed_comm_s"])
    assert slowest([first, second]) == 1


def test_a_wait_never_exceeds_the_rank_s_own_region_and_overlap_is_a_share_of_message_time():
    # rank 0 left its sync before rank 1 arrived (its buckets were done): it cannot have waited longer than it stayed
    ranks = [[figures(1, 1.0, 0.2, comm=0.5, in_backward=0.4)], [figures(1, 2.0, 0.2, comm=0.5, in_backward=0.1)]]
    first, _ = split(ranks)
    assert first[0]["sync_wait_s"] == pytest.approx(0.2) and first[0]["sync_transfer_s"] == 0
    assert means(first)["comm_overlap"] == pytest.approx(0.8)
    assert means([]) == {}


def test_the_clock_offset_comes_from_the_fastest_round_trip_and_half_of_it_bounds_the_error():
    # the peer's clock runs 5 s ahead; a slow round (0.2 s each way) and a fast one (1 ms each way)
    rounds = [(0.0, 5.2, 5.2, 0.4), (10.0, 15.001, 15.001, 10.002)]
    assert offset_from(rounds) == Alignment(pytest.approx(5.0), pytest.approx(0.001))


def test_the_window_of_steps_and_the_straggler_are_parsed_or_refused():
    assert parse_window("10:20") == (10, 20) and parse_window("7") == (7, 7) and parse_window(None) is None
    assert parse_window("5:")[0] == 5
    for bad in ("x", "0:3", "9:2", "3-4"):
        with pytest.raises(ValueError, match="--timeline-steps"):
            parse_window(bad)
    # a window outside the steps the job runs (its last, or those a resumed job has done) records nothing: refused
    from mpi_train.config import TrainConfig
    from mpi_train.loop.job import window_outside

    assert window_outside(TrainConfig(timeline_steps="100:200"), 1, 4) == (
        "--timeline-steps 100:200 lies outside the steps this job runs, 1 to 4: the timeline would record none. Give "
        "a window within them, e.g. --timeline-steps 1:4, or leave --timeline-steps out to record them all.")
    assert "steps this job runs, 31 to 60" in window_outside(TrainConfig(timeline_steps="10:20"), 31, 60)
    assert window_outside(TrainConfig(timeline_steps="3:200"), 1, 4) is None  # cut to 3..4
    assert window_outside(TrainConfig(timeline=True), 31, 60) is None and window_outside(TrainConfig(), 1, 4) is None
    assert Slowdown(1, 0.3) == Slowdown(1, 0.3)
    for bad in ("1", "a:0.3", "1:-1", "-1:0.3"):
        with pytest.raises(UserError, match="MPI_TRAIN_SLOW"):
            _slowdown(bad)


def _slowdown(value: str):
    import os

    os.environ["MPI_TRAIN_SLOW"] = value
    try:
        return Slowdown.from_env()
    finally:
        del os.environ["MPI_TRAIN_SLOW"]


def test_a_recorder_notes_the_region_and_keeps_only_the_window_s_steps():
    recorder = StepRecorder(Alignment(offset_s=0.5), overlapped=True, window=(2, 2))
    for step in (1, 2):
        recorder.begin(step)
        assert recorder.detailed == (step == 2) and recorder.wants_messages
        recorder.current.last_ready = 3.0
        message = recorder.message("allreduce", 2.5, None, 100, bucket=0)
        message.end = 3.5
        recorder.end((0.0, 1.0, 1.5 if step == 2 else 1.0, 3.2, 4.0, 4.5))
    first, second = recorder.take()
    assert second["step"] == 2 and second["region"] == first["region"]
    assert first["arrival"] == pytest.approx(2.5) and first["region"] == pytest.approx(1.0)  # on rank 0's clock
    assert first["comm"] == pytest.approx(1.0) and first["in_backward"] == pytest.approx(0.5)
    assert [step.step for step in recorder.kept] == [2] and recorder.take() == []


def test_on_a_gpu_gradients_are_hooked_for_a_timeline_only_and_arrival_is_backward_s_end():
    """A hook's host clock on a GPU says when backward queued a gradient: there the hooks cost the host and are left
    out unless a timeline draws the gradients, and the step arrives at its backward's end mark, not its last hook."""
    def backward_once(recorder: StepRecorder) -> Step:
        model = torch.nn.Linear(3, 2)
        recorder.watch(model)
        recorder.begin(1)
        model(torch.ones(4, 3)).sum().backward()
        return recorder.current

    assert backward_once(StepRecorder(Alignment(), overlapped=True)).last_ready is not None  # a CPU's hooks
    assert backward_once(StepRecorder(Alignment(), overlapped=True, gpu=True)).gradients == []
    timeline = StepRecorder(Alignment(), overlapped=True, window=(1, 1), gpu=True)
    step = backward_once(timeline)
    assert [index for index, _ in step.gradients] == [1, 0] and step.last_ready is None  # bias first, then weight
    timeline.end((0.0, 1.0, 1.5, 3.2, 4.0, 4.5))
    assert timeline.take()[0]["arrival"] == pytest.approx(3.2)


def test_the_trace_has_a_named_process_per_rank_and_a_named_track_per_kind():
    step = Step(4, bounds=(1.0, 1.1, 1.2, 1.5, 1.6, 1.7), gradients=[(0, 1.3)],
                messages=[Message("allreduce", 1.25, 1.45, 64.0, bucket=0), Message("codec", 1.5, 1.52, kind="codec")])
    events = [step_events(rank, [step], 0.0, ["w"]) for rank in range(2)]
    document = trace(events, ["a", "b"], [Alignment(), Alignment(1e-4, 2e-5)], {"run": "r"})
    json.dumps(document)  # plain JSON, as Perfetto and chrome://tracing read it
    names = {(e["pid"], e["args"]["name"]) for e in document["traceEvents"] if e["name"] == "process_name"}
    assert names == {(0, "rank 0 (a)"), (1, "rank 1 (b)")}
    tracks = {e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    assert tracks == {"phases", "gradients", "messages", "codec"}
    phases = [e for e in document["traceEvents"] if e.get("cat") == "phase" and e["pid"] == 0]
    assert [e["name"] for e in phases] == ["data", "forward", "backward", "sync", "optimizer"]
    message = next(e for e in document["traceEvents"] if e.get("cat") == "message" and e["pid"] == 0)
    assert (message["ts"], message["dur"], message["args"]["bucket"]) == (1.25e6, pytest.approx(2e5), 0)
    assert document["otherData"]["clock_alignment"][1] == {"rank": 1, "offset_s": 1e-4, "error_s": 2e-5}


def test_a_message_is_on_the_wire_from_the_last_rank_s_launch_or_the_end_of_the_one_queued_before_it():
    # two reduce-scatters queued on each of two ranks in step 3; rank 1 launches them late (at 50 and 60 ms)
    queued = {0: [(0.00, 0.10), (0.00, 0.20)], 1: [(0.05, 0.10), (0.06, 0.20)]}
    steps = {rank: Step(3, bounds=(0.0, 0.0, 0.0, 0.0, 0.3, 0.3),
                        messages=[Message("reduce-scatter", start, end, bucket=b) for b, (start, end) in
                                  enumerate(spans)] + [Message("codec", 0.0, 0.3, kind="codec"),
                                                       Message("average", 0.0, 0.3, kind="background")])
             for rank, spans in queued.items()}
    steps[0].messages.append(Message("all-gather", 0.25, 0.28, bucket=0))
    events = [event for rank, step in steps.items() for event in step_events(rank, [step], 0.0, [])]
    wire = wire_per_step(events)
    # the first: from rank 1's launch (50 ms) to 100 ms; the second from the first's end (100 ms) to 200 ms, on both
    # ranks; the codec interval and a background average are no collective; a message on one rank is its own
    assert wire.keys() == {"reduce-scatter", "all-gather"}
    assert wire["reduce-scatter"] == [pytest.approx(0.15)] and wire["all-gather"] == [pytest.approx(0.03)]
    # the console's line sets each beside the model's seconds of its collective, a DDP bucket's beside allreduce's
    assert against_model({"reduce-scatter": 0.25, "allreduce (DDP bucket)": 0.5}, {"reduce-scatter": 0.2,
                                                                                  "allreduce": 0.4, "all-gather": 0.1}
                         ) == ("reduce-scatter 250.0 ms (model 200.0 ms, -20%), allreduce (DDP bucket) 500.0 ms (model "
                               "400.0 ms, -20%); the model: all-gather 100.0 ms")


def test_a_second_job_of_one_run_name_keeps_the_first_jobs_timeline(tmp_path):
    """The default run name (SYNC-npN-seedS) recurs across models and reruns; the second job once overwrote the
    first's files."""
    (tmp_path / "ddp-np4-seed0.trace.json").write_text("{}")  # an earlier job's
    assert claim_names(tmp_path, "ddp-np4-seed0") == (tmp_path / "ddp-np4-seed0-2.trace.json",
                                                     tmp_path / "ddp-np4-seed0-2.swimlanes.png")
    (tmp_path / "ddp-np4-seed0-3.swimlanes.png").write_bytes(b"")  # a picture without its trace is taken too
    assert claim_names(tmp_path, "ddp-np4-seed0")[0].name == "ddp-np4-seed0-4.trace.json"
    assert (tmp_path / "ddp-np4-seed0.trace.json").read_text() == "{}"
    assert claim_names(tmp_path, "flat-np2-seed1")[0].name == "flat-np2-seed1.trace.json"


@pytest.mark.e2e
def test_a_straggler_is_waited_for_and_the_trace_shows_it(mlflow_server, tmp_path):
    """Four ranks, rank 3 computing 0.3 s longer each step: flat (after backward) and ddp (inside it), tracked."""
    slow = 0.3
    args = ["--dataset", "synthetic", "--synthetic-size", "1024", "--batch-size", "64", "--max-steps", "8",
            "--log-every", "4", "--experiment", "tests-timeline", "--tracking-uri", mlflow_server,
            "--timeline-steps", "3:4", "--system-metrics-every", "0"]
    runs = train_several(4, tmp_path, {sync: [*args, "--sync", sync] for sync in ("flat", "ddp")},
                         env={"MPI_TRAIN_SLOW": f"3:{slow}"}, timeout=300, cwd=tmp_path)
    client = client_for(mlflow_server)
    for sync, summary in runs.items():
        split_ = summary["sync_split_after_warmup"]
        assert split_["slowest_rank"] == 3, split_
        for rank, figures_ in enumerate(split_["per_rank"]):
            wait = figures_["sync_wait_s"]
            # (0.29-0.31 s for the 0.3 s straggler in a job of its own, untracked, at np 2 and 4; 0.24-0.25 s has
            # been read in the suite on this 2-core machine, with tracking and the timeline on)
            assert (slow * 0.75 < wait < slow * 1.3) if rank != 3 else wait < 0.05 * slow, (sync, rank, figures_)
        for alignment in summary["clock_alignment"]:  # one machine, one clock: the true offset (0) is in bounds
            assert abs(alignment["offset_s"]) <= alignment["error_s"] + 1e-9, alignment
            assert alignment["error_s"] < 5e-3, alignment  # half a round trip: under 1 ms idle, 1.6 ms seen under load
        parent, children = job_runs(client, "tests-timeline", f"{sync}-np4-seed42")
        assert parent.data.metrics["summary/slowest_rank"] == 3
        assert parent.data.metrics["summary/sync_wait_s"] == pytest.approx(split_["mean"]["sync_wait_s"])
        assert len(summary["recorder_busy_s"]) == 4  # the recorder's own time, a timeline's included: a sliver
        assert 0 < parent.data.metrics["summary/recorder_share"] < 0.01
        assert {m.step for m in client.get_metric_history(children[0].info.run_id, "rank/sync_wait_s")} == {4, 8}
        artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "timeline")}
        assert artifacts == {f"timeline/{sync}-np4-seed42.trace.json", f"timeline/{sync}-np4-seed42.swimlanes.png"}
        # on the wire: each message from rank 3's launch, so the wait for it is left out (with it the mean over
        # ranks would be 3/4 of 0.3 s at least; ddp's buckets, under rank 3's backward, took 40 ms without it)
        wire = summary["timeline"]["wire_s_per_step"]
        assert wire and all(0 < seconds < slow / 2 for seconds in wire.values()), (sync, wire)
        assert parent.data.metrics["summary/wire_s"] == pytest.approx(sum(wire.values()))
        document = json.loads((tmp_path / "timelines" / f"{sync}-np4-seed42.trace.json").read_text())
        events = document["traceEvents"]
        assert {e["pid"] for e in events} == {0, 1, 2, 3}
        assert {e["args"]["step"] for e in events if e.get("cat") == "phase"} == {3, 4}
        for rank in (0, 1):  # the rank waits for rank 3 inside its sync region: message time covers it
            phases = {(e["args"]["step"], e["name"]): e for e in events if e["pid"] == rank and e.get("cat") == "phase"}
            messages = [e for e in events if e["pid"] == rank and e.get("cat") == "message" and e["args"]["step"] == 4]
            assert messages, sync
            backward = phases[4, "backward"]
            if sync == "ddp":  # its buckets leave during backward (which also holds the wait for rank 3)
                assert {e["args"]["bucket"] for e in messages} == set(range(len(messages)))
                assert all(backward["ts"] <= e["ts"] <= backward["ts"] + backward["dur"] for e in messages)
            else:  # after backward, inside the sync phase
                sync_phase = phases[4, "sync"]
                assert all(sync_phase["ts"] <= e["ts"] and e["ts"] + e["dur"] <= sync_phase["ts"] + sync_phase["dur"]
                           + 1000 for e in messages)
