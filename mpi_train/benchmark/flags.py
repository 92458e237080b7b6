"""The flags the bench and the advisor share with a training job, made from TrainConfig's fields (their names,
types, choices and defaults) with the help each of these commands gives them."""

from __future__ import annotations

from collections.abc import Sequence

from ..config import add_config_arguments, check_timeout
from ..errors import UserError
from ..netmodel import rate_bytes_per_s

# the help these rank programs give a field, where it differs from training's
RANK_PROGRAM_HELP = {
    "launcher": "what started the ranks (default: auto, detected)",
    "backend": "process-group backend (default: auto)",
    "threads": "CPU threads per rank (default: this host's cores divided by its ranks)",
    "master_addr": "rendezvous address (default: $MASTER_ADDR, else chosen)",
    "timeout": "seconds a collective may wait (default: 300)",
    "tracking_uri": "MLflow server or database (default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db)",
}


def add_job_arguments(parser, names: Sequence[str], helps: dict[str, str] | None = None,
                      defaults: dict | None = None) -> None:
    """TrainConfig's fields `names` as flags of `parser`, in that order (the order --help lists them in), each with
    `helps`' text, else RANK_PROGRAM_HELP's, else the field's own, and `defaults`' value, else the field's."""
    for name in names:
        text = (helps or {}).get(name, RANK_PROGRAM_HELP.get(name))
        add_config_arguments(parser, (name,), defaults, helps={name: text} if text else None)


def check_job_arguments(args, world: int) -> None:
    """The checks of the flags both commands take from a job: a --link rate that reads, --threads above 0, a
    --timeout in range, and a global --batch-size that splits evenly across the ranks."""
    if args.threads is not None and args.threads <= 0:
        raise UserError(f"--threads must be positive, got {args.threads}. Leave it out to split this host's cores "
                        f"among its ranks.")
    check_timeout(args.timeout)
    if args.link:
        try:
            rate_bytes_per_s(args.link)
        except ValueError as error:
            raise UserError(f"--link: {error}.") from None
    if args.batch_size % world:
        raise UserError(f"--batch-size {args.batch_size} is the global batch and must split evenly across the {world} "
                        f"ranks. Use a multiple of {world}.")
