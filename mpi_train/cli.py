"""`python -m mpi_train`: flags built from TrainConfig, and one guard that turns failures into clean exits.

Launch line: mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
import typing
from typing import Callable, Optional, Sequence

from .cluster import Cluster
from .config import ENV_DEFAULTS, TrainConfig
from .errors import UserError, format_error, raised_in_collective
from .models import MODELS
from .sync import COMPRESSORS, SYNC_METHODS

REGISTRIES = {"sync": tuple(SYNC_METHODS), "compression": tuple(COMPRESSORS), "model": tuple(MODELS)}


class RankAwareParser(argparse.ArgumentParser):
    """An ArgumentParser that stays silent on ranks other than 0, so errors and --help print once."""

    def __init__(self, *args, quiet: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.quiet = quiet

    def _print_message(self, message, file=None):  # the single choke point for argparse output
        if not self.quiet:
            super()._print_message(message, file)


def _field_type(field: dataclasses.Field) -> type:
    hint = typing.get_type_hints(TrainConfig)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    parser = RankAwareParser(
        prog="python -m mpi_train", quiet=quiet,
        description="Data-parallel training under mpirun, comparing gradient-sync methods.",
        epilog="Launch with: mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter",
    )
    for field in dataclasses.fields(TrainConfig):
        meta = dict(field.metadata)
        choices = meta.pop("choices", None)
        if isinstance(choices, str):
            choices = REGISTRIES[choices]
        flag = "--" + field.name.replace("_", "-")
        if _field_type(field) is bool:  # on/off switches: present means on
            parser.add_argument(flag, action="store_true", **meta)
            continue
        if field.default is not None and "default" not in meta["help"]:
            meta["help"] += f" (default: {field.default})"
        parser.add_argument(
            flag, type=_field_type(field), default=field.default,
            choices=choices, **meta,
        )
    return parser


def parse_config(argv: Optional[Sequence[str]], quiet: bool = False) -> TrainConfig:
    values = vars(build_parser(quiet).parse_args(argv))
    for name, variable in ENV_DEFAULTS.items():
        if values[name] is None and os.environ.get(variable):
            values[name] = os.environ[variable]
    return TrainConfig(**values)


def collective_failure(cluster: Cluster, error: BaseException, timeout_s: Optional[float]) -> str:
    info = cluster.info
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    cut_off, silent = cluster.liveness.cut_off_s(), cluster.liveness.silent()
    limit = f" (now {timeout_s:g} s)" if timeout_s else ""
    if cut_off:
        cause = (f"Rank 0 (on {cluster.hosts[0]}) has not answered this rank's heartbeat for {cut_off:.0f} s: this host's "
                 f"network link is down, or rank 0 is gone.")
        advice = "Check this host's network link; with --checkpoint-every, --resume continues the job once it is back."
    elif silent:
        cause = "Unreachable: " + "; ".join(stall.describe() for stall in silent) + ": its network link is down, or the host is gone."
        if cluster.liveness.alone():  # every other host: the cut may as well be on this side
            cause += f" (Every other host went silent: the link of this host, {info.host}, may be the one down.)"
        advice = "Check that host's network link; with --checkpoint-every, --resume continues the job once it is back."
    else:
        behind = ", ".join(f"rank {rank} on {cluster.hosts[rank]}" for rank in cluster.laggards())
        cause = (f"Behind the others: {behind}; it failed, is stuck, or is too slow there." if behind else
                 "Another rank most likely failed first; its own message is above or below.")
        advice = f"If a rank is only slow (first-time data loading, a busy host), raise --timeout{limit}."
    return (f"rank {info.rank} on {info.host}: a collective operation failed ({first_line}). {cause} "
            f"Stopping every rank. {advice}")


def guarded(cluster: Cluster, body: Callable[[], None], timeout_s: Optional[float] = None) -> int:
    """Run `body`; a failure on any rank ends the whole job instead of leaving peers blocked.

    Errors every rank raised together exit normally (rank 0 prints them once); anything
    else prints on the rank that failed and aborts the MPI job, which stops every rank.
    """
    info = cluster.info
    try:
        body()
        return 0
    except UserError as error:
        if error.collective:
            if info.is_main:
                print(format_error(str(error)), file=sys.stderr)
            return error.exit_code
        print(format_error(f"rank {info.rank} on {info.host}: {error}"), file=sys.stderr)
        cluster.abort(error.exit_code)
    except KeyboardInterrupt:
        print(f"mpi_train: rank {info.rank} on {info.host} interrupted; stopping every rank.", file=sys.stderr)
        cluster.abort(130)
    except BaseException as error:
        if raised_in_collective(error):  # a symptom of another rank's failure: say who, not where in torch
            print(format_error(collective_failure(cluster, error, timeout_s)), file=sys.stderr)
        else:
            print(f"mpi_train: rank {info.rank} on {info.host} failed ({type(error).__name__}: {error}); stopping every rank.\n"
                  f"{traceback.format_exc()}", file=sys.stderr, end="")
        cluster.abort(1)
    return 1  # not reached: abort ends the process


def join_job(argv: Optional[Sequence[str]]) -> Cluster:
    """Discovery through the launcher --launcher names (auto: the one detected), before the other flags are
    parsed (they print on rank 0 only); a clear error and exit status 2 if it fails."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--launcher", default="auto")
    known, _ = early.parse_known_args(argv)
    try:
        return Cluster.discover(known.launcher)
    except UserError as error:
        print(format_error(str(error)), file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .train import run

    cluster = join_job(argv)
    config = parse_config(argv, quiet=not cluster.info.is_main)
    return guarded(cluster, lambda: run(config, cluster), config.timeout)


def console_main() -> None:
    """The `mpi-train` command: like python -m, it ends through exit_process (see cluster.exit_process)."""
    from .cluster import exit_process

    exit_process(main())
