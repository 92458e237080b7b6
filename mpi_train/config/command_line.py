"""The training command's flags, built from TrainConfig's fields, and a job file of them (--config): the parser every
rank program that trains (training, the GPU check, the test programs) reads its job from.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from ..errors import UserError
from ..rankguard import RankAwareParser
from .fields import ENV_DEFAULTS
from .flags import add_config_arguments
from .job_file import check_file_ranges, parse_job_file, read_job_file
from .train_config import TrainConfig


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    parser = RankAwareParser(
        prog="python -m mpi_train train", quiet=quiet,
        description="Data-parallel training under mpirun, comparing gradient-sync methods.",
        epilog="Launch with: mpirun -np 4 --hostfile hostfile python -m mpi_train --sync gather_scatter",
    )
    parser.add_argument("--config", metavar="FILE.toml",
                        help="a job file: these options by name with _ for - (batch_size = 256), one a line; a flag "
                             "given here overrides its key. Every tracked run logs the job it ran as one, its "
                             "artifact config.toml, which reruns it")
    add_config_arguments(parser)
    return parser


def shared_job_file(path: str, cluster) -> str:
    """The job file as rank 0 reads it, on every rank (so it need only be where rank 0 runs); if rank 0 cannot read
    it, every rank raises the same UserError. Collective."""
    text, problem = None, None
    if cluster.info.is_main:
        try:
            text = read_job_file(path)
        except UserError as error:
            problem = str(error)
    shared = cluster.bcast({"text": text, "problem": problem})
    if shared["problem"]:
        raise UserError(shared["problem"])
    return shared["text"]


# the options that name a file or folder: a leading ~ is the user's home, never a folder named "~" in this one
PATH_FIELDS = ("data_dir", "calibration", "summary_json", "timeline_dir", "checkpoint_dir", "resume", "advice")


def parse_config(argv: Sequence[str] | None, quiet: bool = False, cluster=None) -> TrainConfig:
    """The job's options, each taken by config/'s precedence: the flag given, else the job file's key (--config),
    else the environment's (ENV_DEFAULTS), else TrainConfig's default. With `cluster`, rank 0 reads the job file for
    every rank (collective); a mistake in it raises the same UserError on every rank."""
    parser = build_parser(quiet)
    path, text, from_file = parser.parse_args(argv).config, "", {}
    if path is not None:
        path = os.path.expanduser(path)  # --config=~/job.toml, which the shell leaves as it is
        text = shared_job_file(path, cluster) if cluster is not None else read_job_file(path)
        from_file = parse_job_file(text, path)
        parser.set_defaults(**from_file)  # below the flags, above the fields' defaults
    values = vars(parser.parse_args(argv))
    del values["config"]
    for name, variable in ENV_DEFAULTS.items():
        if values[name] is None and os.environ.get(variable):
            values[name] = os.environ[variable]
    for name in PATH_FIELDS:  # as a shell would: a job file's, or --flag=~/x, which the shell leaves as it is
        if isinstance(values[name], str) and values[name].startswith("~"):
            values[name] = os.path.expanduser(values[name])
    config = TrainConfig(**values)
    if from_file:
        check_file_ranges(config, from_file, text, path)
    return config
