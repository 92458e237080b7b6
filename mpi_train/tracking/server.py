"""`python -m mpi_train server`: an MLflow tracking server on this project's store, in one command.

Runs `mlflow server` with the SQLite store mlruns/mlflow.db (the one training uses by
default) and serves artifacts from mlruns/, so the UI shows jobs logged either way.
It binds to loopback unless --host names another address; Ctrl-C stops it cleanly.

    python -m mpi_train server --host 127.0.0.1 --port 5000
    mpirun -np 4 python -m mpi_train --tracking-uri http://127.0.0.1:5000

Anyone who reaches an MLflow server without authentication can read, change and delete every
run. So beyond loopback it runs MLflow's authentication app (--auth): the admin is
$MLFLOW_TRACKING_USERNAME / $MLFLOW_TRACKING_PASSWORD when set (the variables jobs and MLflow's
clients read), else `admin` with a generated password kept in ROOT/credentials, readable by its
owner only (`set -a; . mlruns/credentials; set +a` gives a shell the variables). Listening beyond
loopback without --auth is refused unless --insecure says it is meant.

    python -m mpi_train server --host 0.0.0.0 --auth
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ArgumentParser, UserError, format_error
from ..files import write_private
from .probe import wait_for_server
from .store import DEFAULT_STORE_DIR, check_database, check_schema, check_store_dir

START_TIMEOUT_S = 120.0  # a cold start (database migrations) takes ~15 s on two cores
# the fix for a damaged database under --root, {where} being its path
MOVE_OR_START_ELSEWHERE = ("Move it aside (`mv {where} {where}.damaged`) and the server starts an empty one in its "
                           "place, or pass --root with another folder.")


def whole_in(low: int, high: int, what: str):
    """An argparse type: a whole number in [low, high], else argparse's one-line refusal saying so."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}, a whole number from {low} to {high}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m mpi_train server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on; name another only to open the UI to other machines "
                             "(default: 127.0.0.1)")
    parser.add_argument("--port", type=whole_in(1, 65535, "a port"), default=5000,
                        help="port to listen on (default: 5000)")
    parser.add_argument("--root", default=DEFAULT_STORE_DIR,
                        help=f"folder holding mlflow.db and the artifacts (default: {DEFAULT_STORE_DIR})")
    parser.add_argument("--workers", type=whole_in(1, 64, "a count of processes"), default=2,
                        help="server worker processes (default: 2)")
    parser.add_argument("--auth", action="store_true",
                        help="run MLflow's authentication app: every request needs a user and password (the admin: "
                             "$MLFLOW_TRACKING_USERNAME/$MLFLOW_TRACKING_PASSWORD, else generated into "
                             "ROOT/credentials)")
    parser.add_argument("--insecure", action="store_true",
                        help="listen beyond loopback without authentication, knowing anyone who reaches the port can "
                             "read, change and delete every run")
    return parser


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
CREDENTIALS = "credentials"  # under --root: the generated admin's variables, readable by its owner only
MIN_PASSWORD = 12  # MLflow's authentication refuses shorter ones


def check_exposure(host: str, auth: bool, insecure: bool) -> None:
    """Refuse to open the store to a network without authentication, unless told that is meant."""
    if host in LOOPBACK_HOSTS or host.startswith("127.") or auth or insecure:
        return
    raise UserError(f"--host {host} would open the tracking server to the network without authentication: anyone who "
                    f"reaches port and address could read, change and delete every run and artifact. Add --auth to "
                    f"require a user and password (MLflow's authentication app; jobs pass MLFLOW_TRACKING_USERNAME and "
                    f"MLFLOW_TRACKING_PASSWORD), keep the default --host 127.0.0.1, or add --insecure if the network "
                    f"is yours alone.")


def check_address(host: str, port: int) -> None:
    """Bind the address and port the server would listen on, and let go: a port another program holds, or an address
    that is not this machine's, is one paragraph before MLflow takes seconds to start and makes the store."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise UserError(f"--host {host} is not an address ({error.strerror}): give one of this machine's (127.0.0.1, "
                        f"the default; 0.0.0.0 for all of them, with --auth).") from None
    with socket.socket(family, kind, protocol) as trial:
        trial.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's own: a closed port is free
        try:
            trial.bind(address)
        except OSError as error:
            why = {errno.EADDRINUSE: f"port {port} is in use by another program (another server? `ss -ltnp 'sport "
                                     f"= :{port}'` names it): pick another --port, or stop that program",
                   errno.EADDRNOTAVAIL: f"{host} is not an address of this machine (`ip -brief address` lists "
                                        f"them): give one of those, 127.0.0.1 (the default), or 0.0.0.0 for all",
                   errno.EACCES: "a port below 1024 needs root: pick a --port from 1024 up (5000, the default)"}
            raise UserError(f"the server cannot listen on {host}:{port}: "
                            f"{why.get(error.errno, error.strerror or str(error))}.") from None


def admin_credentials(root: Path) -> tuple[str, str, str]:
    """(user, password, where they come from): the variables jobs read, else the generated ones in ROOT/credentials
    (made once, readable by its owner only)."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return user, password, "$MLFLOW_TRACKING_USERNAME and $MLFLOW_TRACKING_PASSWORD"
    path = root / CREDENTIALS
    if not path.exists():
        write_private(path, f"MLFLOW_TRACKING_USERNAME=admin\nMLFLOW_TRACKING_PASSWORD={secrets.token_urlsafe(24)}\n")
    try:
        values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    except (OSError, UnicodeDecodeError) as error:
        reason = "is a folder" if path.is_dir() else f"cannot be read as text ({error.__class__.__name__})"
        raise UserError(f"{path}, where the server keeps its admin's user and password, {reason}. Move it aside to "
                        f"have a password generated, or set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD."
                        ) from None
    if not values.get("MLFLOW_TRACKING_USERNAME") or not values.get("MLFLOW_TRACKING_PASSWORD"):
        raise UserError(f"{path} holds no MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD lines. Delete it to "
                        f"have a password generated, or set both variables.")
    return values["MLFLOW_TRACKING_USERNAME"], values["MLFLOW_TRACKING_PASSWORD"], str(path)


def check_password(password: str, source: str) -> None:
    """MLflow's authentication refuses an admin password under MIN_PASSWORD characters with a traceback, after its
    start: said first, here."""
    if len(password) < MIN_PASSWORD:
        raise UserError(f"the admin password from {source} has {len(password)} characters, and MLflow's "
                        f"authentication takes none under {MIN_PASSWORD}. Set a longer MLFLOW_TRACKING_PASSWORD.")


def auth_environment(root: Path, user: str, password: str) -> dict:
    """What MLflow's authentication app reads: its config (users kept in ROOT/basic_auth.db), the admin, and the
    key that signs its forms (kept in ROOT/flask_secret, owner only, so a restart keeps it)."""
    secret = os.environ.get("MLFLOW_FLASK_SERVER_SECRET_KEY")
    if not secret:
        keep = root / "flask_secret"
        if not keep.exists():
            write_private(keep, secrets.token_urlsafe(32))
        secret = keep.read_text().strip()
    config = root / "basic_auth.ini"
    config.write_text("[mlflow]\ndefault_permission = READ\n"
                      f"database_uri = sqlite:///{root / 'basic_auth.db'}\n"
                      "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    return {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_USERNAME": user,
            "MLFLOW_AUTH_ADMIN_PASSWORD": password, "MLFLOW_FLASK_SERVER_SECRET_KEY": secret}


def server_command(host: str, port: int, root: Path, workers: int, auth: bool = False) -> list[str]:
    return [
        sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port), "--workers", str(workers),
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--serve-artifacts", "--artifacts-destination",
        str(root), *(["--app-name", "basic-auth"] if auth else []),
    ]


def wait_until_healthy(url: str, process: subprocess.Popen, timeout_s: float = START_TIMEOUT_S) -> None:
    if wait_for_server(url, timeout_s, every_s=0.5, gave_up=lambda: process.poll() is not None) is None:
        return
    if process.poll() is not None:
        raise UserError(f"mlflow server exited with status {process.returncode} before it answered at {url}: its "
                        f"messages above say why (the port and the store were checked before it started).")
    raise UserError(f"mlflow server did not answer at {url} within {timeout_s:.0f} s. Its messages are above.")


# The reaper's program: stop the server's process group once the command's pipe closes, however the command ended.
REAPER = """\
import os, signal, sys, time
sys.stdin.buffer.read()
group = int(sys.argv[1])
def alive():  # a process of the group that has not exited: one that has, uncollected by its parent, is done
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False
for sent in (signal.SIGTERM, signal.SIGKILL):
    try:
        os.killpg(group, sent)
    except ProcessLookupError:
        break
    for _ in range(150):
        time.sleep(0.1)
        if not alive():
            sys.exit(0)
"""


def reaper(process: subprocess.Popen) -> subprocess.Popen:
    """A tiny process (no imports of note) that stops the server's group once this command is gone, SIGKILL
    included: the server runs in a session of its own, which no signal to this command reaches."""
    return subprocess.Popen([sys.executable, "-c", REAPER, str(process.pid)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


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


class NewStore:
    """The databases (and the --root folder) a server made for a new store: MLflow creates a store's tables as it
    starts, so a server stopped before it first answers (Ctrl-C in its first seconds) may leave them half-made, which
    every later start would fail on. Until it answers they are removed on the way out; from then on they are whole."""

    def __init__(self, root: Path, databases: Sequence[Path]):
        self.folders_made = [folder for folder in (root, *root.parents) if not folder.exists()]  # deepest first
        self.databases = [database for database in databases if not database.exists()]
        root.mkdir(parents=True, exist_ok=True)

    def made(self) -> None:
        self.databases = []

    def discard_if_unmade(self) -> None:
        for database in self.databases:
            for part in ("", "-journal", "-wal", "-shm"):
                database.with_name(database.name + part).unlink(missing_ok=True)
        if self.databases:
            with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
                for folder in self.folders_made:
                    folder.rmdir()


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    root = Path(args.root).resolve()
    url = f"http://{args.host}:{args.port}"
    try:
        check_address(args.host, args.port)  # first: a host that is no address here needs no word on exposure
        check_exposure(args.host, args.auth, args.insecure)
        check_store_dir(root, "or pass --root with another folder", for_a_job=False)
        databases = (root / "mlflow.db", *([root / "basic_auth.db"] if args.auth else []))
        for database in databases:
            if database.is_dir():  # MLflow would retry it for two minutes, then print its traceback
                raise UserError(f"{database} is a folder, where the server keeps its SQLite store. Move it aside, "
                                f"or pass --root with another folder.")
            check_database(database, MOVE_OR_START_ELSEWHERE)  # before the server starts: nothing is left running
        check_schema(root / "mlflow.db", "or pass --root with another folder")
        new = NewStore(root, databases)
        env, who = dict(os.environ), "none: anyone who reaches it may read and write every run"
        if args.auth:
            user, password, source = admin_credentials(root)
            check_password(password, source)
            env.update(auth_environment(root, user, password))
            who = f"user {user} with the password in {source}"
        # Its own process group: Ctrl-C reaches only us, and we stop the server and its workers together.
        process = subprocess.Popen(server_command(args.host, args.port, root, args.workers, args.auth),
                                   start_new_session=True, env=env)
        watcher = reaper(process)
    except UserError as error:
        print(format_error(str(error)), file=sys.stderr)
        return error.exit_code
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even if started where SIGINT was ignored
    for ending in (signal.SIGTERM, signal.SIGHUP):  # `kill`, or the terminal or ssh session closed: as Ctrl-C
        signal.signal(ending, _interrupt)
    try:
        wait_until_healthy(url, process)
        new.made()
        print(f"MLflow UI: {url}\nStore: {root / 'mlflow.db'} (artifacts under {root})\nAuthentication: {who}\n"
              f"Train with: mpirun -np 4 python -m mpi_train --tracking-uri {url}\nCtrl-C stops the server.",
              flush=True)
        return process.wait()
    except UserError as error:
        print(format_error(str(error)), file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            print("\nstopping the MLflow server...", file=sys.stderr, flush=True)
        return 0
    finally:
        for ending in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C cannot cut the stop short
            signal.signal(ending, signal.SIG_IGN)
        stop(process)
        watcher.stdin.close()  # the server is gone: the reaper finds no group and leaves
        watcher.wait()
        new.discard_if_unmade()
