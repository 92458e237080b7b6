"""`python -m mpi_train replay`: send to MLflow what jobs spooled while the tracking server was unreachable.

    python -m mpi_train replay [--tracking-uri http://HOST:PORT] [SPOOL_FILE_OR_FOLDER ...]

Each spool (default: every one under mlruns/spool/) is sent in order and deleted only
once the server has taken all of it. Running it again, or after an interruption, sends
nothing twice (see spool.py). A spool whose job is still running is left to that job.

A line cut short (a crash or a full disk while a job appended it) or overwritten holds
no whole write: every intact line is still sent, the damaged ones are named by line
number and byte offset, the spool is set aside as `<name>.jsonl.damaged`, and the
command exits 2, since the runs lack what those lines held.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from ..config import given_uri, redact_uri
from ..errors import ArgumentParser, UserError, format_error
from .probe import ServerUnreachable, probe_server
from .saved_model import ModelSaving
from .spool import SPOOL_DIR, Spool, first_line, unreadable_record
from .store import SERVER_SCHEMES, check_api, check_uri, mlflow_client

WRITER_PID = re.compile(r"^job-\d{8}-\d{6}-(\d+)\.jsonl$")
MODEL_FOLDER = ModelSaving.MODEL_NAME  # the artifacts of a model the job saved


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m mpi_train replay", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", metavar="SPOOL",
                        help=f"spool files (*.jsonl) or folders holding them (default: {SPOOL_DIR})")
    parser.add_argument("--tracking-uri", help="MLflow server (or database) to send to (default: "
                                               "$MLFLOW_TRACKING_URI, else the one each spool was written for)")
    return parser


def spool_files(paths: Sequence[str]) -> list[Path]:
    found = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found += sorted(path.glob("*.jsonl"))
        elif path.is_file() and path.suffix == ".jsonl":
            found.append(path)
        elif not path.exists() and path.suffix == ".jsonl":
            raise UserError(f"{name} does not exist: a spool is removed once everything in it was sent, so it may "
                            f"have been sent already (by its job once the server was back, or by an earlier replay). "
                            f"Name a spool file (*.jsonl) or a folder of them, such as {SPOOL_DIR}.")
        else:
            raise UserError(f"{name} is neither a spool file (*.jsonl) nor a folder holding them. Spools are written "
                            f"to {SPOOL_DIR} under the folder a job was started from; name that folder or a file in "
                            f"it.")
    return found


def looks_like_a_spool(spool: Spool) -> bool:
    """Whether `spool` is a job's: one of its lines is a whole write, or a replay acknowledged some. A folder named
    for the replay may hold other JSON-lines files (a data set's): those are neither sent nor set aside as damaged."""
    return spool.acked_path.exists() or bool(spool.records())


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
    stored = records[0].get("uri") if records else None
    if not stored or "***" in stored:
        raise UserError(f"{spool.path} does not say which server it is for (or its address had a password, which "
                        f"is never written to disk). Pass --tracking-uri http://HOST:PORT.")
    return stored


def replay_one(path: Path, override: str | None) -> str | None:
    """Send one spool's intact writes; what its damaged lines were, as one paragraph, or None if it had none."""
    spool = Spool(path)
    pending = len(spool)
    if not pending:
        if spool.damaged():
            return set_aside(spool, 0)
        spool.remove()
        print(f"{path}: nothing left to send; removed.")
        return None
    records = spool.records()
    unreadable = unreadable_record(records)
    if unreadable:
        raise UserError(f"{path} holds a write this version cannot send: {unreadable}. It was written by another "
                        f"version of mpi_train, or edited. Nothing was sent, and the spool is kept: replay it with the "
                        f"version its job ran.")
    uri = target_uri(spool, override)
    if check_uri(uri) in SERVER_SCHEMES:
        try:
            probe_server(uri)
        except ServerUnreachable as error:
            parts = urlsplit(uri)
            start = f"python -m mpi_train server --host {parts.hostname} --port {parts.port or 80}"
            raise UserError(f"{error.what} {path} is kept ({pending} write(s) to send). Start the server (`{start}`) "
                            f"or pass --tracking-uri http://HOST:PORT, and run this command again.") from None
    client = mlflow_client(uri)  # a damaged store is named here, before anything is sent
    check_api(client, uri, f"Nothing was sent; {path} is kept.")
    creating = {record["local_id"]: record for record in records if record["kind"] == "create_run"}
    try:
        sent, ids = spool.replay(client, uri)
    except Exception as error:  # noqa: BLE001 - what was sent is acknowledged; the rest waits for the next replay
        left = len(spool)
        raise UserError(f"sending {path} to {redact_uri(uri)} stopped after {pending - left} of {pending} write(s) "
                        f"({first_line(error)}). The "
                        f"spool is kept; run this command again to send the rest (nothing is sent twice).") from None
    models = {record["run_id"] for record in records if record["kind"] == "log_artifact"
              and Path(record["artifact_path"]).parts[:1] == (MODEL_FOLDER,)}
    runs = [created_run(creating.get(local, {}), run, local in models) for local, run in ids.items()]
    created = f"; runs created: {', '.join(runs)}" if runs else ""
    damaged = spool.damaged()
    print(f"{path}: sent {sent} write(s) to {redact_uri(uri)}{created}" + ("." if damaged else "; removed."))
    return set_aside(spool, sent) if damaged else None


def created_run(record: dict, run_id: str, saved_model: bool) -> str:
    """How the replay's line names a run it created: the job's run that holds a saved model says where it loads from
    (runs:/ID/model)."""
    job = (record.get("tags") or {}).get("mpi_train.role") == "job"
    return f"{record.get('run_name') or 'a run'} {run_id}" + (
        f" (the job's run: its saved model loads as runs:/{run_id}/{MODEL_FOLDER})" if job and saved_model else "")


SHOWN_LINES = 5  # damaged lines named one by one; the rest are counted


def set_aside(spool: Spool, sent: int) -> str:
    """Once all of it that is intact was sent: the spool set aside, and its damaged lines as one paragraph."""
    damaged = spool.damaged()
    named = ", ".join(f"line {number} (byte {offset})" for number, offset in damaged[:SHOWN_LINES])
    more = f" and {len(damaged) - SHOWN_LINES} more" if len(damaged) > SHOWN_LINES else ""
    aside = spool.set_aside()
    one = len(damaged) == 1
    return (f"{spool.path}: {named}{more} {'is' if one else 'are'} damaged (cut short or overwritten: a crash or a "
            f"full disk while the job wrote {'it' if one else 'them'}) and could not be sent; every intact write has "
            f"been sent ({sent} by this replay). The job's runs lack what {'that line' if one else 'those lines'} "
            f"held (metrics, or a run's end). The spool is kept as {aside}, which no replay picks again: delete it "
            f"once you have looked.")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    override = given_uri(args.tracking_uri)
    errors = []  # a paragraph per spool with damaged lines (the replay goes on with the others), then what stopped it
    if not args.paths and not SPOOL_DIR.exists():  # none named, and no job started here spooled anything
        print(f"no spool to send: there is no {SPOOL_DIR} in {Path.cwd()}. Jobs spool under the folder they were "
              f"started from; run this there, or name a spool.")
        return 0
    try:
        paths = args.paths or [str(SPOOL_DIR)]
        files = spool_files(paths)
        if not files:
            print(f"no spool to send in {', '.join(paths)}.")
        for path in files:
            if not looks_like_a_spool(Spool(path)):
                print(f"{path}: not a spool (no line of it is a write a job spooled); left as it is.")
                continue
            if writer_is_running(path):
                print(f"{path}: its job is still running and sends it itself; skipped.")
                continue
            errors += filter(None, [replay_one(path, override)])
    except UserError as error:
        errors.append(str(error))
    for message in errors:
        print(format_error(message), file=sys.stderr)
    # non-zero when a line was damaged too: writes a job made are lost, which a script chaining the replay must learn
    return UserError.exit_code if errors else 0
