"""`predict`'s numbers read and refused before any work, as training would refuse the job they describe: a
prediction for a negative batch, or for 33.3 samples a rank, is of a job no one can run."""

from __future__ import annotations

import argparse

from .. import netmodel
from ..errors import UserError
from ..sync.averaging import DEFAULT_PERIOD


def parse_ranks(text: str) -> list[int]:
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ranks = []
    if not ranks or any(r < 1 for r in ranks):
        raise UserError(f"--ranks {text!r} must be a positive number of ranks or a comma-separated list of them, "
                        f"e.g. --ranks 64 or --ranks 2,4,8,16.")
    return sorted(set(ranks))


LARGEST = 1e9  # beyond any real batch, bucket or second per sample; 1e300 overflowed the model's sums to inf and nan


def check_numbers(args: argparse.Namespace) -> None:
    """The numbers the flags give, refused before any work (a prediction from a negative batch means nothing)."""
    if args.momentum is not None and not 0 <= args.momentum < 1:
        raise UserError(f"--momentum must be in [0, 1), got {args.momentum}.")
    for flag, value in {"--batch-size": args.batch_size, "--ranks-per-host": args.ranks_per_host,
                        "--bucket-mb": args.bucket_mb, "--per-rank-batch": args.per_rank_batch,
                        "--compute-per-sample": args.compute_per_sample}.items():
        if value is not None and not 0 < value <= LARGEST:  # (nan is neither)
            raise UserError(f"{flag} must be a positive number up to {LARGEST:g}, got {value}.")
    if args.link:
        try:
            netmodel.rate_bytes_per_s(args.link)
        except ValueError as error:
            raise UserError(f"--link: {error}.") from None


def check_batch_splits(args: argparse.Namespace, ranks: list[int]) -> None:
    """The global batch splits evenly across each rank count, as training requires: a step of 33.3 samples a rank is
    a job no one can run."""
    if args.per_rank_batch is not None and args.per_rank_batch != int(args.per_rank_batch):
        raise UserError(f"--per-rank-batch {args.per_rank_batch:g} is not a whole number of samples, and a rank "
                        f"computes whole samples. Give one, e.g. {max(1, round(args.per_rank_batch))}. Nothing was "
                        f"predicted.")
    uneven = [n for n in ranks if args.batch_size % n]
    if args.per_rank_batch or not uneven:
        return
    n = uneven[0]
    lower = max(n, args.batch_size - args.batch_size % n)
    raise UserError(f"--batch-size {args.batch_size} is the global batch and does not split evenly across "
                    f"{', '.join(map(str, uneven))} ranks, as training requires. Use a multiple of {n} (e.g. {lower} "
                    f"or {lower + n}), other --ranks, or --per-rank-batch to keep each rank's batch instead. Nothing "
                    f"was predicted.")


def check_averaging(args: argparse.Namespace) -> None:
    """localsgd's and diloco's --period, --host-period and --fragments, refused as training refuses them."""
    if args.period is not None and args.period < 1:
        raise UserError(f"--period must be at least 1 (the steps between two averages), got {args.period}.")
    if args.host_period is not None and args.host_period < 0:
        raise UserError(f"--host-period must not be negative (0: no average inside a host between them), got "
                        f"{args.host_period}.")
    period = args.period if args.period is not None else DEFAULT_PERIOD
    if args.fragments is not None and (args.fragments < 1 or period % args.fragments):
        raise UserError(f"--fragments {args.fragments} must be at least 1 and divide --period {period}: one fragment "
                        f"is averaged every period/F steps.")
