"""An mpirun launch line's hosts: which still answer, and the same line on other hosts.

The supervisor reads where a line puts its ranks (-np, --hostfile or --host), asks each host
to run one process through mpirun itself (so through whatever reaches the hosts: ssh, a
launch agent, the test hosts' namespaces), and writes the line again on another set of hosts:
without a host gone for good, when the user allows fewer ranks, or with hosts that returned or
joined, up to --max-ranks: a hostfile of those hosts, -np set to a number of ranks that splits
the global batch, and --reshard.
"""

from __future__ import annotations

import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..config import TrainConfig
from ..errors import UserError
from . import mpirun

LAUNCHERS = ("mpirun", "mpiexec", "prterun")
NP_FLAGS = ("-np", "--np", "-n", "-c")
HOSTFILE_FLAGS = ("--hostfile", "-hostfile", "--machinefile", "-machinefile")
HOST_FLAGS = ("--host", "-host", "-H")
PROBE_TIMEOUT_S = 10.0  # a host whose probe takes longer does not answer (asked again until --host-wait)


@dataclass(frozen=True)
class Placement:
    """The hosts an mpirun line names, each with its slots, and the ranks it starts."""

    hosts: tuple[tuple[str, int], ...]
    ranks: int
    batch_size: int  # the job's global batch: the ranks must split it evenly
    accumulate: int = 1  # --accumulate: each rank's share must split into as many equal micro-batches

    @property
    def names(self) -> list[str]:
        return [host for host, _ in self.hosts]

    def fewer(self, gone: set[str], min_ranks: int) -> Placement | None:
        """The most ranks the hosts left can run that split the global batch (each share into --accumulate equal
        micro-batches, as the resharded job checks), at least `min_ranks`; None if none."""
        left = tuple((host, slots) for host, slots in self.hosts if host not in gone)
        for ranks in range(min(self.ranks, sum(slots for _, slots in left)), min_ranks - 1, -1):
            if ranks > 0 and self.batch_size % (ranks * self.accumulate) == 0:
                return Placement(left, ranks, self.batch_size, self.accumulate)
        return None

    def most_ranks(self, slots: int, cap: int) -> int:
        """The most ranks, at most `slots` and `cap`, that split the global batch into equal shares of equal
        micro-batches (0 if none)."""
        return next((ranks for ranks in range(min(slots, cap), 0, -1)
                     if self.batch_size % (ranks * self.accumulate) == 0), 0)

    def more(self, offered: tuple[tuple[str, int], ...], max_ranks: int) -> Placement | None:
        """These hosts and the `offered` ones (a host already here takes its offered slots), with the most ranks up to
        `max_ranks` that split the global batch; None when that is no more ranks than this placement runs."""
        slots = dict(self.hosts)
        slots.update(offered)
        ranks = self.most_ranks(sum(slots.values()), max_ranks)
        if ranks <= self.ranks:
            return None
        return Placement(tuple(slots.items()), ranks, self.batch_size, self.accumulate)


def _value(line: list[str], flags: tuple[str, ...]) -> tuple[int, str] | None:
    """(index of the value, value) of the first of `flags` in the line, as `-f V` or `-f=V`."""
    for i, token in enumerate(line):
        if token in flags and i + 1 < len(line):
            return i + 1, line[i + 1]
        for flag in flags:
            if flag.startswith("--") and token.startswith(flag + "="):
                return i, token.split("=", 1)[1]
    return None


def read_hostfile(path: Path) -> tuple[tuple[str, int], ...]:
    """`host slots=N` lines (comments and blank lines skipped; a host without slots= has one; repeats add up); a
    ValueError names the line of a slot count that is not a whole number."""
    slots: dict[str, int] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        given = next((w.split("=", 1)[1] for w in words[1:] if w.startswith(("slots=", "max_slots="))), "1")
        if not given.isdigit():
            raise ValueError(f"line {number} of {path}, {raw.strip()!r}: slots= takes a whole number of ranks")
        slots[words[0]] = slots.get(words[0], 0) + int(given)
    return tuple(slots.items())


def hostfile_of(line: list[str]) -> Path | None:
    """The hostfile the line names, if it names one."""
    found = _value(line, HOSTFILE_FLAGS)
    return Path(found[1]) if found else None


def parse_hosts(spec: str) -> tuple[tuple[str, int], ...]:
    """--host a:2,b:2 (or a,a,b: each name once per slot)."""
    slots: dict[str, int] = {}
    for item in filter(None, spec.split(",")):
        host, _, count = item.partition(":")
        slots[host] = slots.get(host, 0) + (int(count) if count else 1)
    return tuple(slots.items())


def whole(flag: str, value: str) -> int:
    """A flag's whole number, or a ValueError that names the flag (not int()'s "invalid literal")."""
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{flag} {value!r} is not a whole number") from None


def placement(line: list[str], hosts_at_least: int = 2) -> Placement | None:
    """Where an mpirun line puts its ranks; None for other launchers (torchrun, srun) or fewer named hosts than
    `hosts_at_least` (one host has none to leave out; a job that may grow can start on one)."""
    if not line or Path(line[0]).name not in LAUNCHERS:
        return None
    try:
        hostfile, hosts = _value(line, HOSTFILE_FLAGS), _value(line, HOST_FLAGS)
        named = read_hostfile(Path(hostfile[1])) if hostfile else parse_hosts(hosts[1]) if hosts else ()
        np_ = _value(line, NP_FLAGS)
        ranks = whole("-np", np_[1]) if np_ else sum(slots for _, slots in named)
        batch = _value(line, ("--batch-size",))
        default_batch = TrainConfig.__dataclass_fields__["batch_size"].default
        batch_size = whole("--batch-size", batch[1]) if batch else default_batch
        accumulate = _value(line, ("--accumulate",))
        accumulate = whole("--accumulate", accumulate[1]) if accumulate else 1
    except (OSError, ValueError) as error:
        raise UserError(f"the launch line's hosts could not be read ({error}). Check its -np, --hostfile or --host, "
                        f"--batch-size and --accumulate.") from None
    return Placement(named, ranks, batch_size, accumulate) if len(named) >= max(1, hosts_at_least) else None


def answering(line: list[str], hosts: list[str], env: dict, cancel: threading.Event | None = None,
              timeout_s: float = PROBE_TIMEOUT_S) -> set[str]:
    """The hosts that start a process through the line's own launcher within `timeout_s`, asked at once (a
    `cancel` set meanwhile ends every probe, none answering)."""

    def answers(host: str) -> bool:
        with mpirun.own_tmpdir() as tmpdir:
            probe = mpirun.start([line[0], "-np", "1", "--host", f"{host}:1", "true"],
                                 {**env, **tmpdir}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout_s
            try:
                while time.monotonic() < deadline and not (cancel and cancel.is_set()):
                    try:
                        return probe.wait(0.2) == 0
                    except subprocess.TimeoutExpired:
                        continue
                return False
            finally:
                mpirun.stop(probe, grace_s=2)

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        return {host for host, ok in zip(hosts, pool.map(answers, hosts)) if ok}


def _set(line: list[str], found: tuple[int, str], value: str) -> None:
    """Put `value` where `_value` found the old one (`-f V` or `--flag=V`)."""
    index, old = found
    line[index] = value if line[index] == old else line[index].split("=", 1)[0] + f"={value}"


def on_hosts(line: list[str], where: Placement, folder: Path) -> list[str]:
    """The line on `where`: a hostfile of its hosts written to `folder` (or --host rewritten), -np set to its ranks,
    and --reshard added once."""
    out = list(line)
    hostfile = _value(out, HOSTFILE_FLAGS)
    if hostfile:
        path = folder / "hostfile"
        path.write_text("".join(f"{host} slots={slots}\n" for host, slots in where.hosts))
        _set(out, hostfile, str(path))
    else:
        _set(out, _value(out, HOST_FLAGS), ",".join(f"{host}:{slots}" for host, slots in where.hosts))
    np_ = _value(out, NP_FLAGS)
    if np_:
        _set(out, np_, str(where.ranks))
    else:
        out[1:1] = ["-np", str(where.ranks)]
    return out if "--reshard" in out else [*out, "--reshard"]
