"""What both soaks share: the MLflow server on the test hosts' bridge, and finding a job's processes on any host."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..tracking.server import server_command, wait_until_healthy
from ..tracking.server import stop as stop_server
from .network import NetworkPlan, NetworkSetting
from .testhosts import TestHosts, check_can_run

OUTAGE_S = 8  # the server is away this long, plus its restart (~15 s)


class Server:
    """`mlflow server` on the hosts' bridge; `outage()` stops it and starts it again OUTAGE_S later, in a thread."""

    def __init__(self, address: str, root: Path):
        with socket.socket() as probe:
            probe.bind((address, 0))
            self.port = probe.getsockname()[1]
        self.address, self.root, self.process = address, root, None
        self.uri = f"http://{address}:{self.port}"
        self.back: threading.Thread | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "server.log", "a") as log:
            self.process = subprocess.Popen(server_command(self.address, self.port, self.root, 1), stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        wait_until_healthy(self.uri, self.process)

    def outage(self) -> None:
        stop_server(self.process)

        def come_back() -> None:
            time.sleep(OUTAGE_S)
            self.start()

        self.back = threading.Thread(target=come_back, daemon=True)
        self.back.start()

    def wait_up(self) -> None:
        if self.back:
            self.back.join()
            self.back = None

    def stop(self) -> None:
        self.wait_up()
        if self.process:
            stop_server(self.process)


def processes_of(marker: str, mpirun_pid: int | None = None) -> list[int]:
    """Pids of the job's ranks (their command line names the trial's folder) and of its launch daemons (prted,
    whose command line names mpirun's job as prterun-HOST-PID@N)."""
    daemon = re.compile(rf"(^|/)prted .*-{mpirun_pid}@\d") if mpirun_pid else None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in args or daemon and daemon.search(args):
            found.append(int(entry.name))
    return found


def rank_pid(marker: str, rank: int) -> int | None:
    """The pid of the job's rank `rank` (Open MPI tells each rank its number in its environment)."""
    for pid in processes_of(marker):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and b"mpi_train" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    return None


def end_leftovers(marker: str, mpirun_pid: int) -> None:
    """SIGKILL whatever of the job is still alive (counted before, as left behind)."""
    for pid in processes_of(marker, mpirun_pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextmanager
def hosts_and_server(args, out: Path, command: str) -> Iterator[tuple[TestHosts, NetworkSetting, Server]]:
    """The soak's test hosts with their links shaped, and an MLflow server on their bridge, for a `with`: both
    removed on every way out."""
    plan = NetworkPlan((args.hosts,), (args.ranks_per_host,), (args.link,), prefix=args.prefix, subnet=args.subnet)
    check_can_run(plan, Path(command))
    setting = NetworkSetting(args.hosts, args.link, args.ranks_per_host)
    with TestHosts(plan, out / "hosts") as hosts:
        hosts.apply(setting)
        server = Server(f"{plan.subnet}.1", out / "mlruns")
        try:
            print(f"soak: starting the MLflow server at {server.uri}", flush=True)
            server.start()
            yield hosts, setting, server
        finally:
            server.stop()
