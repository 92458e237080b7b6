"""The step clock on CPUs: marks in order, read as perf_counter seconds; a lagged clock (a GPU's way) reads each step
once the next has closed, and a drain reads what is left."""

import contextlib
import fcntl
import os
import re
import struct
import termios
import threading
import time

import torch

from mpi_train.clock import StepClock


def closed_step(clock: StepClock, name: str, pause_s: float = 0.0):
    first = clock.start()
    time.sleep(pause_s)
    later = clock.mark()
    return clock.close(lambda at: (name, first, later, at[later] - at[first]))


def test_marks_read_back_in_order_and_start_afresh():
    clock = StepClock(torch.device("cpu"))
    ((name, first, later, took),) = closed_step(clock, "a", 0.01)
    assert (name, first, later) == ("a", 0, 1) and took >= 0.01
    assert closed_step(clock, "b")[0][:3] == ("b", 0, 1) and clock.drain() == []


def test_a_lagged_clock_reads_each_step_after_the_next_and_a_drain_the_rest():
    clock = StepClock(torch.device("cpu"), lagged=True)
    assert closed_step(clock, "a", 0.01) == []
    ((name, *_, took),) = closed_step(clock, "b")
    assert name == "a" and took >= 0.01  # the first step's own marks, read after the second closed
    assert [figures[0] for figures in closed_step(clock, "c")] == ["b"]
    assert [figures[0] for figures in clock.drain()] == ["c"] and clock.drain() == []


@contextlib.contextmanager
def stdout_on(terminal: bool):
    """sys.stdout on a real pseudo-terminal 120 columns wide (as a terminal window is), or on a pipe; yields the list
    that holds, once the block has ended, everything written there."""
    read_fd, write_fd = os.openpty() if terminal else os.pipe()
    if terminal:
        fcntl.ioctl(write_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    written: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(read_fd, 65536)
            except OSError:  # a terminal's reading end once its writing end is closed
                return
            if not chunk:
                return
            written.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        with open(write_fd, "w", encoding="utf-8", buffering=1) as stream, contextlib.redirect_stdout(stream):
            yield written
    finally:
        reader.join(10)
        os.close(read_fd)


def test_a_job_read_a_step_late_trains_the_same_and_draws_each_step_s_own_times(tmp_path, monkeypatch):
    """The GPU's lagged reading, run on a CPU: the same losses as reading each step at once, and each timeline step's
    gradients inside that step's own backward (phase times given to the step they were marked in). The two jobs also
    check rank 0's live progress bar (reporter.py): the first prints to a terminal, the second to a pipe."""
    import functools
    import json

    from mpi_train import train
    from mpi_train.cluster import Cluster
    from mpi_train.commands.train import parse_config

    cluster = Cluster.discover("auto")
    summaries, printed = {}, {}
    for lagged in (False, True):
        monkeypatch.setattr(train, "StepClock", functools.partial(StepClock, lagged=lagged))
        out = tmp_path / f"lagged-{lagged}"
        monkeypatch.chdir(tmp_path)
        with stdout_on(terminal=not lagged) as written:
            train.run(parse_config(["--dataset", "synthetic", "--synthetic-size", "512", "--batch-size", "64",
                                    "--log-every", "3", "--max-steps", "7", "--no-tracking", "--dropout", "0",
                                    "--timeline-steps", "2:6", "--run-name", f"lagged-{lagged}",
                                    "--summary-json", str(out.with_suffix(".json"))], quiet=True), cluster)
        summaries[lagged] = json.loads(out.with_suffix(".json").read_text())
        printed[lagged] = b"".join(written).decode()
    on_terminal, on_pipe = printed[False], printed[True]
    # on a terminal the bar is redrawn in place (\r) below the lines, with the step, the epoch, the time left, and the
    # last logged loss and samples/s; on a pipe there are the lines alone, as they always were
    bar = r"\repoch 1  step 7/7 \|[^|]+\| ETA 00:00, loss \d\.\d{4}, \d+ samples/s"
    assert re.search(bar, on_terminal), on_terminal
    for text in (on_terminal, on_pipe):
        assert re.search(r"(^|\r)epoch 1 step     3/7  loss \d\.\d{4}  lr .* samples/s", text, re.MULTILINE), text
    assert "\r" not in on_pipe and "ETA" not in on_pipe and "step 7/7 |" not in on_pipe, on_pipe
    assert [s["loss"] for s in summaries[True]["steps"]] == [s["loss"] for s in summaries[False]["steps"]]
    assert [s["step"] for s in summaries[True]["steps"]] == [3, 6, 7]
    assert all(s["step_time_s"] > s["compute_time_s"] > 0 for s in summaries[True]["steps"])
    events = json.loads((tmp_path / summaries[True]["timeline"]["trace"]).read_text())["traceEvents"]
    backward = {e["args"]["step"]: e for e in events if e.get("name") == "backward"}
    assert sorted(backward) == [2, 3, 4, 5, 6]
    gradients = [e for e in events if e.get("cat") == "gradient"]
    assert len(gradients) == 5 * 8  # the MNIST CNN's 8 tensors, in each of the 5 steps
    for gradient in gradients:
        phase = backward[gradient["args"]["step"]]
        assert phase["ts"] <= gradient["ts"] <= phase["ts"] + phase["dur"], gradient
