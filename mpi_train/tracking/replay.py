"""`python -m mpi_train replay`: send to MLflow what jobs spooled while the tracking server was unreachable.

    python -m mpi_train replay [--tracking-uri http://HOST:PORT] [SPOOL_FILE_OR_FOLDER ...]

Each spool (default: every one under mlruns/spool/) is sent in order and deleted only
once the server has taken all of it. Running it again, or after an interruption, sends
nothing twice (see spool.py). A spool whose job is still running is left to that job.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from ..config import redact_uri
from ..errors import UserError, format_error
from .probe import ServerUnreachable, probe_server
from .spool import SPOOL_DIR, Spool, first_line
from .store import check_uri, mlflow_client

WRITER_PID = re.compile(r"^job-\d{8}-\d{6}-(\d+)\.jsonl$")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mpi_train replay", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", default=[str(SPOOL_DIR)], metavar="SPOOL",
                        help=f"spool files (*.jsonl) or folders holding them (default: {SPOOL_DIR})")
    parser.add_argument("--tracking-uri", help="MLflow server to send to (default: $MLFLOW_TRACKING_URI, else the one "
                                               "each spool was written for)")
    return parser


def spool_files(paths: Sequence[str]) -> list[Path]:
    found = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found += sorted(path.glob("*.jsonl"))
        elif path.is_file() and path.suffix == ".jsonl":
            found.append(path)
        else:
            raise UserError(f"{name} is neither a spool file (*.jsonl) nor a folder holding them. Spools are written "
                            f"to {SPOOL_DIR} under the folder a job was started from; name that folder or a file in "
                            f"it.")
    return found


def writer_is_running(path: Path) -> bool:
    """True if the job that writes this spool is still alive on this host (it re-sends the spool itself)."""
    match = WRITER_PID.match(path.name)
    if not match:
        return False
    try:
        cmdline = Path(f"/proc/{match.group(1)}/cmdline").read_bytes()
    except OSError:
        return False
    return b"mpi_train" in cmdline


def target_uri(spool: Spool, override: str | None) -> str:
    if override:
        return override
    records = spool.records()
    stored = records[0]["uri"] if records else None
    if not stored or "***" in stored:
        raise UserError(f"{spool.path} does not say which server it is for (or its address had a password, which "
                        f"is never written to disk). Pass --tracking-uri http://HOST:PORT.")
    return stored


def replay_one(path: Path, override: str | None) -> None:
    spool = Spool(path)
    pending = len(spool)
    if not pending:
        spool.remove()
        print(f"{path}: nothing left to send; removed.")
        return
    uri = target_uri(spool, override)
    check_uri(uri)
    try:
        probe_server(uri)
    except ServerUnreachable as error:
        raise UserError(f"{error.what} {path} is kept ({pending} write(s) to send). Start the "
                        f"server (`python -m mpi_train server`) or pass --tracking-uri http://HOST:PORT, and run this "
                        f"command again.") from None
    try:
        sent, ids = spool.replay(mlflow_client(uri), uri)
    except Exception as error:  # noqa: BLE001 - what was sent is acknowledged; the rest waits for the next replay
        left = len(spool)
        raise UserError(f"sending {path} to {redact_uri(uri)} stopped after {pending - left} of {pending} write(s) "
                        f"({first_line(error)}). The "
                        f"spool is kept; run this command again to send the rest (nothing is sent twice).") from None
    created = f"; runs created: {', '.join(sorted(ids.values()))}" if ids else ""
    print(f"{path}: sent {sent} write(s) to {redact_uri(uri)}{created}; removed.")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    override = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
    try:
        files = spool_files(args.paths)
        if not files:
            print(f"no spool to send in {', '.join(args.paths)}.")
        for path in files:
            if writer_is_running(path):
                print(f"{path}: its job is still running and sends it itself; skipped.")
                continue
            replay_one(path, override)
    except UserError as error:
        print(format_error(str(error)), file=sys.stderr)
        return error.exit_code
    return 0
