"""The hosts a supervised job may grow onto, and when each is ready.

Candidates are the hosts the job was launched on and left behind, the hosts of the launch
line's hostfile (re-read each time: a host added there is offered), and those a discovery
command prints (--host-discovery-script, Horovod's contract: `host:slots` lines, a bare host
being one slot). A candidate is ready once it has answered every asking for --host-cooldown
seconds. Each time a host is lost (it stopped answering, or did not answer when a job failed) its
cooldown doubles, up to MAX_COOLDOWN_FACTOR times --host-cooldown, so a host that flaps is held
back longer each time and the job never thrashes between sizes, and one that has settled
still comes back. A host lost more than once that answers again when a job fails is left out
of the relaunch all the same (when --min-ranks allows), and rejoins by growing.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from . import launchline

DISCOVERY_TIMEOUT_S = 30.0
DISCOVERY_POLL_S = 0.2  # how often a discovery that runs on is checked for the supervision's stop
MAX_COOLDOWN_FACTOR = 16  # a host lost again and again waits at most this many --host-cooldown
HOST_SLOTS = re.compile(r"^([A-Za-z0-9_.-]+|\[[0-9A-Fa-f:]+\])(?::(\d+))?$")  # host or host:slots ([IPv6]:slots)


@dataclass(frozen=True)
class Discovered:
    """What one run of the discovery command gave: hosts with slots, and what could not be read (None: all)."""

    hosts: tuple[tuple[str, int], ...]
    problem: str | None = None


def check_script(script: str) -> None:
    """Refuse a discovery command that cannot be run at all, before any job starts."""
    path = Path(script)
    if path.is_dir():
        raise UserError(f"--host-discovery-script {script} is a folder, not a file. Give the path of an executable "
                        f"that prints one `host:slots` line per host that may take ranks (Horovod's contract).")
    if not path.is_file():
        raise UserError(f"--host-discovery-script {script}: no such file. Give the path of an executable that prints "
                        f"one `host:slots` line per host that may take ranks (Horovod's contract).")
    if not path.stat().st_mode & 0o111:
        raise UserError(f"--host-discovery-script {script} is not executable. Make it so (chmod +x {script}); it "
                        f"prints one `host:slots` line per host that may take ranks.")


def parse_discovered(text: str) -> Discovered:
    """`host:slots` lines (blank lines and # comments skipped); a malformed line is left out and named."""
    hosts: dict[str, int] = {}
    bad: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        found = HOST_SLOTS.match(line)
        slots = int(found.group(2) or 1) if found else 0
        if not found or slots < 1:
            bad.append(f"line {number} {raw.strip()!r}")
            continue
        hosts[found.group(1)] = slots
    problem = (f"{'; '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} of its output is not `host:slots` (a host "
               f"name and a positive number of slots) and was skipped") if bad else None
    return Discovered(tuple(hosts.items()), problem)


def discover(script: str, cancel: threading.Event | None = None) -> Discovered:
    """Run the discovery command once; a failure is a problem to report, never the job's end. It runs in a session of
    its own, so that a timeout, or `cancel` (the supervision stopping), ends whatever it started, not the script
    alone."""
    try:
        process = subprocess.Popen([script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as error:
        return Discovered((), f"it could not be run ({error.strerror})")
    deadline = time.monotonic() + DISCOVERY_TIMEOUT_S
    while True:
        try:  # retried, communicate loses no output
            out, err = process.communicate(timeout=DISCOVERY_POLL_S)
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() < deadline and not (cancel is not None and cancel.is_set()):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            cancelled = time.monotonic() < deadline  # nothing to say: the supervision is ending
            return Discovered((), None if cancelled else f"it did not finish within {DISCOVERY_TIMEOUT_S:g} s")
    if process.returncode != 0:
        said = (err.decode(errors="replace").strip().splitlines() or ["nothing on stderr"])[-1][:200]
        return Discovered((), f"it exited with status {process.returncode} ({said})")
    return parse_discovered(out.decode(errors="replace"))  # bytes that are not UTF-8 make a line that is named


@dataclass
class HostRecord:
    answering_since: float | None = None
    losses: int = 0


@dataclass
class HostWatch:
    """When each candidate host began answering steadily, and how often it was lost."""

    cooldown_s: float
    records: dict[str, HostRecord] = field(default_factory=dict)

    def cooldown(self, host: str) -> float:
        """--host-cooldown, doubled for each loss after the first, at most MAX_COOLDOWN_FACTOR times."""
        losses = self.records[host].losses if host in self.records else 0
        return self.cooldown_s * min(MAX_COOLDOWN_FACTOR, 2 ** max(0, losses - 1))

    def lost(self, hosts: set[str]) -> None:
        """These hosts failed a job or stopped answering."""
        for host in hosts:
            record = self.records.setdefault(host, HostRecord())
            record.losses += 1
            record.answering_since = None

    def flapping(self, hosts: set[str]) -> set[str]:
        """Of `hosts`, those lost more than once: answering now does not make them steady."""
        return {host for host in hosts if host in self.records and self.records[host].losses > 1}

    def observe(self, asked: set[str], answering: set[str], now: float | None = None) -> list[str]:
        """One round of asking: a host that answered starts (or keeps) its steady time; one that had been answering
        and does not is lost. The hosts lost, sorted."""
        now = time.monotonic() if now is None else now
        lost = []
        for host in sorted(asked):
            record = self.records.setdefault(host, HostRecord())
            if host in answering:
                record.answering_since = record.answering_since if record.answering_since is not None else now
            elif record.answering_since is not None:
                self.lost({host})
                lost.append(host)
        return lost

    def next_ready_in(self, hosts: set[str], now: float | None = None) -> float | None:
        """Seconds until the first of `hosts` that answers and is cooling down is ready (None: none is)."""
        now = time.monotonic() if now is None else now
        waits = [self.records[host].answering_since + self.cooldown(host) - now for host in hosts
                 if host in self.records and self.records[host].answering_since is not None]
        waits = [wait for wait in waits if wait > 0]
        return min(waits) if waits else None

    def ready(self, hosts: set[str], now: float | None = None) -> set[str]:
        """Of `hosts`, those that have answered steadily for their cooldown."""
        now = time.monotonic() if now is None else now
        return {host for host in hosts if host in self.records and self.records[host].answering_since is not None
                and now - self.records[host].answering_since >= self.cooldown(host)}


@dataclass
class Candidates:
    """Where the hosts to grow onto come from: the job's first placement, the line's hostfile, a discovery command.
    Each problem with the command is said once."""

    first: launchline.Placement
    hostfile: Path | None
    script: str | None
    said: set[str] = field(default_factory=set)

    def offered(self, say, cancel: threading.Event | None = None) -> dict[str, int]:
        """Every host that may take ranks, with its slots (the discovery command's word last); `cancel` stops a
        discovery that runs on."""
        slots = dict(self.first.hosts)
        if self.hostfile is not None:
            try:
                slots.update(launchline.read_hostfile(self.hostfile))
            except (OSError, ValueError) as error:
                self._once(say, f"the hostfile {self.hostfile} could not be read again ({error}); the job keeps "
                                f"running, and the hosts it named before are still asked.")
        if self.script:
            found = discover(self.script, cancel)
            slots.update(found.hosts)
            if found.problem:
                self._once(say, f"the host discovery script {self.script}: {found.problem}. The job keeps running; "
                                f"the script is run again every few seconds (fix it to offer hosts).")
        return slots

    def _once(self, say, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            say(message)
