"""`python -m mpi_train train` (or flags first, no subcommand): the training command's flags, built from TrainConfig,
run under the rank guard.

Launch line: mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Sequence

from ..config import ENV_DEFAULTS, REGISTRIES, TrainConfig
from ..rankguard import RankAwareParser, guarded, join_job
from ..train import run


def _field_type(field: dataclasses.Field) -> type:
    hint = typing.get_type_hints(TrainConfig)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    parser = RankAwareParser(
        prog="python -m mpi_train train", quiet=quiet,
        description="Data-parallel training under mpirun, comparing gradient-sync methods.",
        epilog="Launch with: mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter",
    )
    for field in dataclasses.fields(TrainConfig):
        meta = dict(field.metadata)
        choices = meta.pop("choices", None)
        if isinstance(choices, str):
            choices = (*REGISTRIES[choices], *meta.pop("also", ()))
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


def parse_config(argv: Sequence[str] | None, quiet: bool = False) -> TrainConfig:
    values = vars(build_parser(quiet).parse_args(argv))
    for name, variable in ENV_DEFAULTS.items():
        if values[name] is None and os.environ.get(variable):
            values[name] = os.environ[variable]
    return TrainConfig(**values)


def main(argv: Sequence[str] | None = None) -> int:
    cluster = join_job(argv)
    config = parse_config(argv, quiet=not cluster.info.is_main)
    return guarded(cluster, lambda: run(config, cluster), config.timeout)
