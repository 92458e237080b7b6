"""`python -m mpi_train.server`: an MLflow tracking server on this project's store, in one command.

Runs `mlflow server` with the SQLite store mlruns/mlflow.db (the one training uses by
default) and serves artifacts from mlruns/, so the UI shows jobs logged either way.
It binds to loopback unless --host names another address; Ctrl-C stops it cleanly.

    python -m mpi_train.server --host 127.0.0.1 --port 5000
    mpirun -np 4 python -m mpi_train --tracking-uri http://127.0.0.1:5000
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import UserError, format_error
from .probe import wait_for_server
from .store import DEFAULT_STORE_DIR, check_store_dir

START_TIMEOUT_S = 120.0  # a cold start (database migrations) takes ~15 s on two cores


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mpi_train.server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on; name another only to open the UI to other machines "
                             "(default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5000, help="port to listen on (default: 5000)")
    parser.add_argument("--root", default=DEFAULT_STORE_DIR,
                        help=f"folder holding mlflow.db and the artifacts (default: {DEFAULT_STORE_DIR})")
    parser.add_argument("--workers", type=int, default=2, help="server worker processes (default: 2)")
    return parser


def server_command(host: str, port: int, root: Path, workers: int) -> list[str]:
    return [
        sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port), "--workers", str(workers),
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--serve-artifacts", "--artifacts-destination",
        str(root),
    ]


def wait_until_healthy(url: str, process: subprocess.Popen, timeout_s: float = START_TIMEOUT_S) -> None:
    if wait_for_server(url, timeout_s, every_s=0.5, gave_up=lambda: process.poll() is not None) is None:
        return
    if process.poll() is not None:
        raise UserError(f"mlflow server exited with status {process.returncode} before it answered at {url} "
                        f"(its messages are above). A port already in use is the usual cause: pick another --port.")
    raise UserError(f"mlflow server did not answer at {url} within {timeout_s:.0f} s. Its messages are above.")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (it forks workers), SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    root = Path(args.root).resolve()
    url = f"http://{args.host}:{args.port}"
    try:
        check_store_dir(root, "pass --root with another folder")
        # Its own process group: Ctrl-C reaches only us, and we stop the server and its workers together.
        process = subprocess.Popen(server_command(args.host, args.port, root, args.workers), start_new_session=True)
    except UserError as error:
        print(format_error(str(error)), file=sys.stderr)
        return error.exit_code
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even if started where SIGINT was ignored
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as cleanly as Ctrl-C
    try:
        wait_until_healthy(url, process)
        print(f"MLflow UI: {url}\nStore: {root / 'mlflow.db'} (artifacts under {root})\n"
              f"Train with: mpirun -np 4 python -m mpi_train --tracking-uri {url}\nCtrl-C stops the server.",
              flush=True)
        return process.wait()
    except UserError as error:
        print(format_error(str(error)), file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("\nstopping the MLflow server...", file=sys.stderr, flush=True)
        return 0
    finally:
        stop(process)


if __name__ == "__main__":
    sys.exit(main())
