"""The hosts a supervised job may grow onto: a discovery script's `host:slots` lines (and what it cannot read), the
hostfile re-read, and a host's cooldown that doubles each time it is lost."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from mpi_train.errors import UserError
from mpi_train.lab import host_watch
from mpi_train.lab.host_watch import (
    MAX_COOLDOWN_FACTOR,
    Candidates,
    HostWatch,
    check_script,
    discover,
    parse_discovered,
)
from mpi_train.lab.launchline import Placement


def script(tmp_path, body: str, name: str = "discover.sh"):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_discovered_lines_are_host_colon_slots_and_a_bad_line_is_named_not_fatal(tmp_path):
    found = parse_discovered("h1:4\n# a comment\n\nh2\n10.0.0.3:2  # trailing\nh4:zero\nh5:0\n")
    assert found.hosts == (("h1", 4), ("h2", 1), ("10.0.0.3", 2))
    assert "line 6 'h4:zero'" in found.problem and "line 7 'h5:0'" in found.problem
    assert parse_discovered("a:2\nb:2\n").problem is None

    assert discover(script(tmp_path, "echo h1:2; echo h2:2\n")).hosts == (("h1", 2), ("h2", 2))
    failing = discover(script(tmp_path, "echo cannot reach the scheduler >&2; exit 3\n", "failing.sh"))
    assert failing.hosts == () and failing.problem == "it exited with status 3 (cannot reach the scheduler)"


def test_a_discovery_that_runs_on_is_ended_with_what_it_started_and_bytes_that_are_not_text_are_a_named_line(
        tmp_path, monkeypatch):
    monkeypatch.setattr(host_watch, "DISCOVERY_TIMEOUT_S", 1.0)
    pid_file = tmp_path / "sleeper.pid"
    hangs = script(tmp_path, f"sleep 60 & echo $! > {pid_file}; wait\n", "hangs.sh")
    begun = time.monotonic()
    assert discover(hangs).problem == "it did not finish within 1 s" and time.monotonic() - begun < 5
    sleeper = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{sleeper}").exists() or "Z" in Path(f"/proc/{sleeper}/stat").read_text().split()[2]

    monkeypatch.setattr(host_watch, "DISCOVERY_TIMEOUT_S", 30.0)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    begun = time.monotonic()
    assert discover(hangs, stop) == host_watch.Discovered(()) and time.monotonic() - begun < 3  # stopped: said nothing

    garbled = discover(script(tmp_path, "echo h1:2; printf 'h\\377\\376:2\\n'\n", "garbled.sh"))
    assert garbled.hosts == (("h1", 2),) and "line 2 'h\ufffd\ufffd:2'" in garbled.problem


def test_a_script_that_cannot_run_is_refused_before_the_job_and_one_that_fails_later_is_said_once(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        check_script(str(tmp_path / "missing.sh"))
    with pytest.raises(UserError, match="is a folder, not a file"):
        check_script(str(tmp_path))
    plain = tmp_path / "plain.sh"
    plain.write_text("echo h1:2\n")
    with pytest.raises(UserError, match=r"is not executable\. Make it so \(chmod \+x"):
        check_script(str(plain))

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=2\n")
    said: list[str] = []
    first = Placement((("a", 2), ("b", 2)), 4, 64)
    candidates = Candidates(first, hostfile, script(tmp_path, "echo c:2; echo 'd two'\n"))
    for _ in range(3):
        offered = candidates.offered(said.append)
    assert offered == {"a": 2, "b": 2, "c": 2}  # the first placement's, the hostfile's and the script's
    assert len(said) == 1 and "line 2 'd two'" in said[0] and "The job keeps running" in said[0]
    hostfile.write_text("a slots=2\ne slots=4\n")  # a host added to the hostfile is offered at the next asking
    assert candidates.offered(said.append)["e"] == 4


def test_a_host_is_ready_after_answering_for_its_cooldown_which_doubles_each_time_it_is_lost():
    watch = HostWatch(cooldown_s=10)
    watch.observe({"h"}, {"h"}, now=0)
    assert watch.ready({"h"}, now=9) == set() and watch.ready({"h"}, now=10) == {"h"}
    assert watch.next_ready_in({"h"}, now=4) == 6
    watch.lost({"h"})  # the job failed for want of it: the first loss keeps --host-cooldown
    assert watch.flapping({"h", "never-lost"}) == set()  # answering again after one loss, it stays in the job
    watch.observe({"h"}, {"h"}, now=20)
    assert watch.ready({"h"}, now=30) == {"h"}
    assert watch.observe({"h"}, set(), now=31) == ["h"]  # it stops answering: lost again, cooldown doubled
    assert watch.observe({"h"}, set(), now=33) == []  # still silent: lost once
    watch.observe({"h"}, {"h"}, now=40)
    assert watch.flapping({"h"}) == {"h"}  # after a failure it would be left out, to rejoin by growing
    assert watch.ready({"h"}, now=55) == set() and watch.ready({"h"}, now=60) == {"h"}
    watch.lost({"h"})
    watch.observe({"h"}, {"h"}, now=100)
    assert watch.cooldown("h") == 40 and watch.ready({"h"}, now=139) == set()
    for _ in range(10):
        watch.lost({"h"})
    assert watch.cooldown("h") == 10 * MAX_COOLDOWN_FACTOR  # a host that settles after many flaps still returns
    assert watch.ready({"never-asked"}, now=1000) == set()
