"""How the bench and the advisor start, as a training job does: the tracking store checked, the device placed, the
precision resolved and the process group opened."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from .. import tracking
from ..cluster import Cluster
from ..config import TrainConfig
from ..devices import Placement, place
from ..errors import format_error
from ..files import unwritable
from ..step.precision import agreed


@dataclass(frozen=True)
class Job:
    """Where a rank program runs and what it records to: rank 0's tracking connection (None elsewhere, and under
    --no-tracking), its placement and the precision it computes in."""

    connection: tracking.Connection | None
    placement: Placement
    precision: str


def open_job(cluster: Cluster, args: argparse.Namespace, workload: TrainConfig,
             outputs: Sequence[tuple[str, str | None, bool]] = ()) -> Job:
    """Rank 0 checks what it will write, `outputs` as (flag, path or None, a folder?), and the store before any work,
    so that minutes of measuring never end in a file that cannot be kept; then every rank's device and threads, the
    precision (auto: what the job would run here) and the process group. Collective."""
    problems = unwritable(outputs) if cluster.info.is_main else None
    cluster.agree(problems and f"{problems} Nothing was measured.", "cannot keep the results")
    connection = tracking.connect(workload, cluster)
    placement = place(cluster, args.backend, args.threads)
    precision = agreed(args.precision, placement.device, cluster).name
    cluster.open_process_group(placement.backend, args.master_addr, args.timeout, placement.device)
    return Job(connection=connection, placement=placement, precision=precision)


def rank_zero_print(cluster: Cluster):
    """print on rank 0, flushed at once (the job's console line order across ranks); nothing on the other ranks."""
    if cluster.info.is_main:
        return lambda *text: print(*text, flush=True)
    return lambda *text: None


def unkept(failures: Sequence[str | None], measured: str) -> int:
    """Rank 0's exit status once every output was tried: 0, or 2 with one paragraph on what was not kept."""
    failed = [failure for failure in failures if failure]
    if failed:
        print(format_error(f"{measured} and the lines above hold its figures, but {'; '.join(failed)}. Free space "
                           f"there, or name another place, and run it again."), file=sys.stderr)
    return 2 if failed else 0
