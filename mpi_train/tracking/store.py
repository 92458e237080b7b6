"""Where a job's runs go: the tracking URI checked, the store or server opened on rank 0, before any work."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..config import ENV_DEFAULTS, STORE_DIR, TrainConfig, redact_uri, resolve_uri
from ..errors import UserError
from ..files import partial_name, remove_dead_partials, write_error
from .probe import ServerUnreachable, probe_server
from .spool import FOREIGN_ANSWER, SPOOL_DIR, Spool, SpoolingClient, first_line, refused
from .store_writes import StoreWrites

DEFAULT_STORE_DIR = STORE_DIR  # the embedded default: SQLite store and artifacts under ./mlruns
SERVER_SCHEMES = ("http", "https")
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
# the pip package of each database driver SQLAlchemy imports, by the module it imports
DRIVER_PACKAGES = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient",
                   "pymysql": "pymysql", "pymssql": "pymssql", "pyodbc": "pyodbc"}
# Unless the user set them: a refused connection gives up after ~3 s (MLflow's defaults, 7 retries with
# doubling back-off, take minutes), a hung server after 3 x 10 s. Writes that fail are spooled and re-sent (spool.py).
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# MLflow's own "View experiment at .../#/experiments/<id>" opens its GenAI overview: we print the runs page instead
# (links.py).
QUIET_LINKS = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
SQLITE_MAX_PATH = 504  # the longest database path SQLite opens: its journal's, 8 characters longer, must fit in 512
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
# MLflow's words for a store whose tables another version of it made
OTHER_SCHEMA = re.compile(r"out-of-date database schema \(found version (\S+), but expected (\S+)\)")
SQLITE_DAMAGE = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB: SQLite's codes for a damaged file, or not a database's
# the fix for a damaged store file, {where} being its path
MOVE_OR_POINT_ELSEWHERE = ("Move it aside (`mv {where} {where}.damaged`) and MLflow starts an empty store in its "
                           "place, or point --tracking-uri (or $MLFLOW_TRACKING_URI) at another store.")


@dataclass(frozen=True)
class Connection:
    """A checked tracking destination on rank 0."""

    client: Any  # mlflow.MlflowClient, or for a server a SpoolingClient around one
    uri: str
    experiment_id: str | None  # None when started offline (--tracking-spool): the replay creates it

    @property
    def online(self) -> bool:
        return self.experiment_id is not None


def mlflow_client(uri: str):
    """An MlflowClient for `uri` that leaves MLflow's own "View run / View experiment" lines out: its experiment link
    opens the GenAI overview, ours the runs (links.py). Every command opens the store here: a damaged SQLite file is
    named as such, not left to a traceback from deep inside MLflow's start."""
    database = sqlite_file(uri)
    if database is not None and database.is_dir():
        raise UserError(f"{given_as(uri)} {redact_uri(uri)} names the folder {database.absolute()}, where a SQLite "
                        f"file belongs. Name the database file, e.g. sqlite:///{database.absolute()}/mlflow.db "
                        f"(the file jobs write in {DEFAULT_STORE_DIR}/).")
    if database is not None:
        check_database(database, MOVE_OR_POINT_ELSEWHERE)
    from mlflow import MlflowClient

    for variable, value in QUIET_LINKS.items():
        os.environ.setdefault(variable, value)
    # MLflow's "Creating initial MLflow database tables..." (a new store is no news), and its ERROR with two
    # tracebacks for each write a database refuses, which the callers say once in their own words (store_writes.py)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    try:
        with creating_alone(database):
            if database is not None and not database.exists():
                make_store(database, MlflowClient)
            return MlflowClient(tracking_uri=uri)  # opens the database (and migrates its tables) now
    except ImportError as error:  # a database's driver that this Python lacks (psycopg for postgresql://)
        package = DRIVER_PACKAGES.get(error.name or "", error.name)
        raise UserError(f"{given_as(uri)} {redact_uri(uri)} needs the Python package {package} (the database's "
                        f"driver), which is not installed where rank 0 runs ({first_line(error)}). Install it "
                        f"(pip install '{package}'), or give a SQLite file (sqlite:///mlruns/mlflow.db) or a tracking "
                        f"server.") from None
    except Exception as error:
        damaged = store_damage(uri, error)
        if damaged:
            raise damaged from None
        raise


@contextlib.contextmanager
def creating_alone(database: Path | None):
    """One process at a time opens a SQLite store: MLflow creates a new store's tables when it finds none, and two
    jobs started at once on a new store (a loop of launches, a Slurm array) would both create them, the second
    failing on "table ... already exists". The lock is the store's folder's own (flock), dropped with its process."""
    if database is None or not database.parent.is_dir():
        yield
        return
    folder = os.open(database.parent, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # a file system without locks (ENOLCK): opened as before, unlocked
            fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # and with it the lock


def make_store(database: Path, client) -> None:
    """A new SQLite store made whole under another name, then renamed into place: a job stopped while MLflow creates
    its tables (Ctrl-C in its first seconds) leaves no half-made store, which every later job would fail to open, and
    no empty folder where the store was to be. Where the store's folder is missing, the folder is what is made under
    another name (its topmost missing parent, with the folders below it)."""
    top = database.parent.absolute()
    while not top.parent.exists() and top != top.parent:
        top = top.parent
    made = top if not top.exists() else database.absolute()  # what the rename puts in place
    remove_dead_partials(made)
    staged = made.with_name(partial_name(made.name, os.getpid()))
    staged_database = staged / database.absolute().relative_to(top) if made == top else staged
    try:
        if made == top:
            staged_database.parent.mkdir(parents=True)
        client(tracking_uri=f"sqlite:///{staged_database}")  # makes every table
        try:
            os.rename(staged, made)
        except OSError:
            if not (made == top and database.exists()):
                raise
            # another job started at once on the new folder made the store first: its store is whole, ours goes
    finally:
        if staged.is_dir():
            shutil.rmtree(staged, ignore_errors=True)
        for left in (staged, staged.with_name(staged.name + "-journal")):
            with contextlib.suppress(OSError):
                left.unlink(missing_ok=True)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI (sqlite:///relative/path or sqlite:////absolute/path), else None."""
    parts = urlsplit(uri)
    database = parts.path[1:]
    if parts.scheme.lower() != "sqlite" or not database or database == ":memory:":
        return None
    return Path(database)


def check_database(database: Path, fix: str) -> None:
    """Raise unless `database` is missing, empty (SQLite makes a store of it) or an SQLite file whose table list
    reads: a file overwritten by anything else would otherwise fail deep inside MLflow's start (or a server's) with a
    long traceback. Opened read-only, so that nothing is created or changed."""
    try:
        with open(database, "rb") as handle:
            head = handle.read(len(SQLITE_HEADER))
    except OSError:  # missing, a folder or unreadable: the folder checks and MLflow say which
        return
    if not head:
        return
    if head != SQLITE_HEADER:
        raise damaged_store(database, "it does not begin with SQLite's header, so it was overwritten or is not a "
                                      "database at all", fix)
    try:
        with contextlib.closing(sqlite3.connect(database.absolute().as_uri() + "?mode=ro", uri=True)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as error:
        code = sqlite_damage(error)
        if code is not None:
            raise damaged_store(database, f"SQLite cannot read its pages (error code {code})", fix) from None


def sqlite_damage(error: BaseException) -> int | None:
    """SQLite's error code if `error` (or what it wraps: SQLAlchemy and MLflow keep the original as the cause) says
    the file's pages are corrupt or not a database's, else None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, sqlite3.DatabaseError) and getattr(error, "sqlite_errorcode", None) in SQLITE_DAMAGE:
            return error.sqlite_errorcode
        seen.add(id(error))
        error = getattr(error, "orig", None) or error.__cause__ or error.__context__
    return None


def store_damage(uri: str, error: BaseException) -> UserError | None:
    """The one paragraph for `error`, if it is SQLite finding the store at `uri` damaged, or MLflow finding its
    tables another version's, else None."""
    database, code = sqlite_file(uri), sqlite_damage(error)
    schema = OTHER_SCHEMA.search(str(error))
    if schema:
        return other_schema(uri, *schema.groups(), "or point --tracking-uri at another store")
    if database is not None and "_alembic_tmp_" in str(error):  # a migration's table, left by a job stopped midway
        return damaged_store(database, "it was left half-made, by a job stopped while MLflow created or upgraded "
                                       "its tables", MOVE_OR_POINT_ELSEWHERE)
    if database is None or code is None:
        return None
    return damaged_store(database, f"SQLite cannot read its pages (error code {code})", MOVE_OR_POINT_ELSEWHERE)


def other_schema(uri: str, found: str, expected: str, elsewhere: str) -> UserError:
    """The one paragraph for a store whose tables another MLflow made (MLflow upgrades none by itself)."""
    from mlflow import __version__  # here, not at the top: as the client, MLflow only once a store is opened

    return UserError(f"The MLflow store {redact_uri(uri)} was made by another version of MLflow: its tables are at "
                     f"schema {found}, and MLflow {__version__} here reads {expected}. Back it up, then upgrade its "
                     f"tables with `mlflow db upgrade {redact_uri(uri)}`; if a newer MLflow made it (the upgrade "
                     f"then names an unknown revision), install that version here instead, {elsewhere}.")


def check_schema(database: Path, elsewhere: str) -> None:
    """Raise unless `database` is missing, new, or at the schema this MLflow reads: a server started on another
    version's store exits with a traceback, read only from its log. Read-only, as check_database."""
    try:
        with contextlib.closing(sqlite3.connect(database.absolute().as_uri() + "?mode=ro", uri=True)) as db:
            found = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:  # missing, new, or no MLflow store: MLflow makes or names it
        return
    from mlflow.store.db.utils import _get_latest_schema_revision  # here, not at the top: only a found store

    expected = _get_latest_schema_revision()
    if found and found[0] != expected:
        raise other_schema(f"sqlite:///{database}", found[0], expected, elsewhere)


def damaged_store(database: Path, why: str, fix: str) -> UserError:
    """The one paragraph for an MLflow store whose SQLite file is damaged."""
    where = database.absolute()
    return UserError(f"The MLflow store {where} is damaged: {why}. No run can be read from it or written to it. "
                     f"{fix.format(where=where)}")


def check_store_dir(directory: Path, flag_hint: str, for_a_job: bool = True) -> None:
    """`directory` must be a folder this user can write, or one that can be made: the SQLite file and artifacts live
    there. Creates nothing: a job stopped before its store is made leaves no empty folder. `for_a_job`: a job's
    store (else the server's, which has no job and no --no-tracking)."""
    reason = write_error(directory, folder=True)
    if reason:
        kept, otherwise = (("The job's runs and artifacts are kept there", ", or pass --no-tracking") if for_a_job
                           else ("The server keeps its runs and artifacts there", ""))
        raise UserError(
            f"The MLflow store folder {directory.resolve()} is not a writable folder: it {reason}. "
            f"{kept}. Make it a writable folder, run from another working directory, {flag_hint}{otherwise}."
        ) from None


def given_as(uri: str) -> str:
    """How the user named `uri`: $MLFLOW_TRACKING_URI where it came from there (a shell's profile sets it, and a
    refusal naming the flag would send the user looking for a flag they never typed), else --tracking-uri."""
    from_environment = os.environ.get(ENV_DEFAULTS["tracking_uri"])
    return f"${ENV_DEFAULTS['tracking_uri']}" if from_environment and uri == from_environment else "--tracking-uri"


def in_the_trash(experiment, uri: str, what_it_does: str, otherwise: str) -> str:
    """The paragraph for an experiment MLflow holds as deleted: how to restore it."""
    return (f"Experiment {experiment.name!r} at {redact_uri(uri)} was deleted: it is in MLflow's trash, which "
            f"{what_it_does}. Restore it (`mlflow experiments restore --experiment-id {experiment.experiment_id}`, "
            f"with MLFLOW_TRACKING_URI={redact_uri(uri)}), or {otherwise}.")


def check_uri(uri: str) -> str:
    """Reject URIs MLflow 3 cannot use, with the fix; returns the scheme."""
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as error:
        raise UserError(f"{given_as(uri)} {redact_uri(uri)!r} is malformed ({error}). {_URI_FORMS}") from None
    written = uri.strip()[:len(parts.scheme)]  # urlsplit gives the scheme in lower case, MLflow matches it as written
    if uri != uri.strip() or written != parts.scheme:
        mended = parts.scheme + uri.strip()[len(parts.scheme):]
        odd = ("white space around it, which MLflow takes as part of the address" if uri != uri.strip() else
               "its scheme in capitals, and MLflow's database stores match their scheme in lower case")
        raise UserError(f"{given_as(uri)} {redact_uri(uri)!r} has {odd}. Give it as {redact_uri(mended)}.")
    scheme = "databricks" if uri.strip().lower() == "databricks" else parts.scheme.lower()  # MLflow's own word for it
    database = Path(parts.path if scheme == "file" else uri)
    if scheme in ("", "file") and database.is_file():
        raise UserError(f"{given_as(uri)} {redact_uri(uri)!r} names the file {database.absolute()} as a plain path, "
                        f"which MLflow takes for a folder of files. Give the SQLite file as a URI: "
                        f"sqlite:///{database.absolute()}")
    if scheme in ("", "file"):
        raise UserError(
            f"{given_as(uri)} {redact_uri(uri)!r} names a folder of files, which MLflow 3 no longer accepts as a "
            f"tracking store. Use a SQLite file instead, e.g. --tracking-uri sqlite:///mlruns/mlflow.db, "
            f"or a tracking server."
        )
    if scheme == "sqlite" and parts.netloc:  # sqlite://mlruns/mlflow.db: "mlruns" read as a host
        raise UserError(f"{given_as(uri)} {redact_uri(uri)!r} names {parts.netloc!r} where a SQLite URI has nothing "
                        f"(it takes three slashes, then the path). Give sqlite:///{parts.netloc}{parts.path} for a "
                        f"path relative to this folder, or sqlite:////ABSOLUTE/PATH.")
    if scheme in SERVER_SCHEMES and not parts.hostname:
        raise UserError(f"{given_as(uri)} {redact_uri(uri)!r} has no host. {_URI_FORMS}")
    if scheme not in SERVER_SCHEMES + DATABASE_SCHEMES + ("databricks",):
        raise UserError(f"{given_as(uri)} {redact_uri(uri)!r} has an unknown scheme {scheme!r}. {_URI_FORMS}")
    if scheme == "databricks" and (missing := databricks_credentials_missing(parts.netloc)):
        raise UserError(f"{given_as(uri)} {redact_uri(uri)!r} names Databricks' hosted MLflow, and {missing}. Set "
                        f"DATABRICKS_HOST and DATABRICKS_TOKEN, or write the profile with `databricks auth login`; "
                        f"or use a store of your own. {_URI_FORMS}")
    return scheme


def databricks_credentials_missing(profile: str) -> str | None:
    """Why MLflow would find no Databricks credentials (its own failure is a 30-line traceback), else None: neither
    $DATABRICKS_HOST nor the profile's section in the Databricks config file."""
    if os.environ.get("DATABRICKS_HOST") and not profile:
        return None
    name = profile or os.environ.get("DATABRICKS_CONFIG_PROFILE") or "DEFAULT"
    config = Path(os.path.expanduser(os.environ.get("DATABRICKS_CONFIG_FILE") or "~/.databrickscfg"))
    try:
        sections = re.findall(r"^\s*\[([^]]+)\]", config.read_text(errors="replace"), re.MULTILINE)
    except OSError:
        return (f"there is no {config} to hold its profile [{name}]" if profile else
                f"neither $DATABRICKS_HOST nor a {config} names the workspace")
    if name not in [section.strip() for section in sections]:
        return f"{config} has no profile [{name}]"
    return None


def check_store_exists(uri: str) -> None:
    """A command that only reads runs names a SQLite store that is not there, or a SQLite file that holds no MLflow
    tables, rather than leave an empty store where the path was mistyped, or MLflow's tables in the user's own
    database (opening it creates them)."""
    database = sqlite_file(uri)
    if database is None or database.is_dir():
        return  # mlflow_client names a folder
    where = (f"Point --tracking-uri at the store your jobs wrote (by default {DEFAULT_STORE_DIR}/mlflow.db under the "
             f"folder they ran from), or run from that folder.")
    if not database.exists():
        raise UserError(f"There is no tracking store at {database.absolute()} ({redact_uri(uri)}): no job has "
                        f"recorded there. {where}")
    check_database(database, MOVE_OR_POINT_ELSEWHERE)
    tables = sqlite_tables(database)
    if not {"experiments", "runs"} <= set(tables):
        held = f"its tables: {', '.join(sorted(tables)[:5])}" if tables else "no tables at all"
        raise UserError(f"{database.absolute()} ({redact_uri(uri)}) is a SQLite file but not an MLflow store "
                        f"({held}), so no job has recorded there; this command only reads, and leaves it as it is. "
                        f"{where}")


def sqlite_tables(database: Path) -> list[str]:
    """The tables of the SQLite file `database` (one check_database has passed), read without changing it."""
    if not database.stat().st_size:
        return []
    with contextlib.closing(sqlite3.connect(database.absolute().as_uri() + "?mode=ro", uri=True)) as db:
        return [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]


_URI_FORMS = ("Give a tracking server as http://HOST:PORT (start one with `python -m mpi_train server`), "
              "or a database such as sqlite:///mlruns/mlflow.db; the flag overrides $MLFLOW_TRACKING_URI.")


def open_store(config: TrainConfig) -> Connection:
    """The job's destination checked and its experiment opened, so that a wrong URI stops the job before any work."""
    uri = resolve_uri(config.tracking_uri)
    scheme = check_uri(uri)
    if scheme == "sqlite":
        database = sqlite_file(uri)
        if database is None:  # sqlite:// or sqlite:///:memory:
            raise UserError(f"{given_as(uri)} {redact_uri(uri)} names a database held in memory, which lives in rank "
                            f"0's process alone and goes with it: nothing of the job's runs could be read. Name a "
                            f"file, e.g. sqlite:///mlruns/mlflow.db, or pass --no-tracking.")
        if len(str(database.absolute())) > SQLITE_MAX_PATH:  # SQLite fails to open it, and MLflow retries
            raise UserError(f"The MLflow store {database.absolute()} has a path of {len(str(database.absolute())):,} "
                            f"characters, and SQLite opens none longer than {SQLITE_MAX_PATH}. Run from a folder "
                            f"with a shorter path, point --tracking-uri at a shorter one (sqlite:////tmp/runs/"
                            f"mlflow.db), or pass --no-tracking.")
        check_store_dir(database.parent, "point --tracking-uri at another sqlite:/// file")
        # where artifacts land: MLflow makes the folder with the first one, so a job refused before it leaves none
        artifacts = Path(DEFAULT_STORE_DIR).absolute()
        check_store_dir(next(folder for folder in (artifacts, *artifacts.parents) if folder.exists()),
                        "point --tracking-uri at a server")
    if scheme in SERVER_SCHEMES:
        # a server that dies mid-job must not hold the job's end for minutes
        for variable, value in HTTP_LIMITS.items():
            os.environ.setdefault(variable, value)
        try:
            probe_server(uri)
        except ServerUnreachable as error:
            if not config.tracking_spool:
                raise UserError(f"{error} To train now and send the runs later, pass --tracking-spool.") from None
            return _offline(config, uri, error.what)
    from mlflow.exceptions import MlflowException

    client = mlflow_client(uri)
    if scheme in SERVER_SCHEMES:
        client = SpoolingClient(client, uri, Spool(job_spool_path()), config.experiment)
    elif scheme in DATABASE_SCHEMES:
        client = StoreWrites(client, uri)
    try:
        experiment = client.get_experiment_by_name(config.experiment)
        if experiment is not None and experiment.lifecycle_stage == "deleted":  # a name the trash still holds
            raise UserError(in_the_trash(experiment, uri, "takes no run", "name another --experiment"))
        if experiment is not None:
            return Connection(client, uri, experiment.experiment_id)
        try:
            return Connection(client, uri, client.create_experiment(config.experiment))
        except MlflowException:  # another job created it a moment ago
            return Connection(client, uri, client.get_experiment_by_name(config.experiment).experiment_id)
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001 - any store failure here is the user's setup
        refusal = credentials_refused(str(error), uri, "Or pass --no-tracking. Nothing was trained and nothing was "
                                                       "spooled.")
        if refusal:
            raise UserError(refusal) from None
        if scheme in SERVER_SCHEMES and not refused(error, uri):  # /health answered, the tracking API did not
            what = api_refusal(error, uri, "")
            if config.tracking_spool:
                return _offline(config, uri, what)
            raise UserError(f"{what} To train now and send the runs later, pass --tracking-spool.") from None
        damaged = store_damage(uri, error)
        if damaged:
            raise damaged from None
        raise UserError(
            f"The MLflow store at {redact_uri(uri)} could not open experiment {config.experiment!r}: "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}. Check --tracking-uri, "
            f"the server's log and its permissions, or pass --no-tracking."
        ) from None


def credentials_refused(error: str, uri: str, outcome: str) -> str | None:
    """The one paragraph for a server that wants credentials this process did not give (or gave wrong), ending in
    `outcome` (what was done and what else to do), else None."""
    if "error code 401" not in error and "error code 403" not in error:
        return None
    given = os.environ.get("MLFLOW_TRACKING_USERNAME") and os.environ.get("MLFLOW_TRACKING_PASSWORD")
    answer = ("401: it does not know this user and password" if "error code 401" in error and given else
              "401: no user and password were given" if "error code 401" in error else
              "403: the user may not write to this experiment")
    return (f"The MLflow server at {redact_uri(uri)} requires authentication and refused this request ({answer}). "
            f"Set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (for a job, rank 0's; or "
            f"MLFLOW_TRACKING_TOKEN) to a user the server knows; for a server started by `python -m mpi_train server "
            f"--auth` without them, its admin is in its --root folder: `set -a; . mlruns/credentials; set +a`. "
            f"{outcome}").strip()


def api_refusal(error: BaseException, uri: str, outcome: str) -> str:
    """Why a server that answers its /health refused a request of its tracking API, in one paragraph ending in
    `outcome`: the credentials it wants, an address that is not MLflow's, or what it said."""
    credentials = credentials_refused(str(error), uri, outcome)
    if credentials:
        return credentials
    foreign = FOREIGN_ANSWER.search(str(error))
    if foreign:
        return (f"{redact_uri(uri)} answered {foreign.group(1)} with HTTP {foreign.group(2)} and a page that is not "
                f"MLflow's: nothing there is an MLflow tracking server (or a proxy in front of one turned the request "
                f"away). Check the address's host, port and path (`python -m mpi_train server` prints its own). "
                f"{outcome}").strip()
    return (f"The MLflow server at {redact_uri(uri)} answers its /health but not its tracking API "
            f"({first_line(error)}). See the server's log. {outcome}").strip()


def check_api(client, uri: str, outcome: str) -> None:
    """A command that reads or sends runs asks a server once first, so that one that will refuse every request is
    told in one paragraph (api_refusal) before anything is read or sent."""
    if check_uri(uri) not in SERVER_SCHEMES:
        return
    try:
        client.get_experiment_by_name("Default")
    except Exception as error:  # noqa: BLE001 - what any request would meet: said in the user's terms
        raise UserError(api_refusal(error, uri, outcome)) from None


def job_spool_path() -> Path:
    return SPOOL_DIR / f"job-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl"


def _offline(config: TrainConfig, uri: str, unreachable: str) -> Connection:
    """--tracking-spool with no server (`unreachable` says why, in a sentence): runs get local ids and everything goes
    to the spool."""
    check_store_dir(SPOOL_DIR, "start the server so that nothing waits in a spool")
    spool = Spool(job_spool_path())
    print(f"mpi_train: warning: {unreachable} Training anyway (--tracking-spool): the runs "
          f"are kept in {spool.path}; send them with `python -m mpi_train replay --tracking-uri {redact_uri(uri)}`.",
          file=sys.stderr, flush=True)
    return Connection(SpoolingClient(mlflow_client(uri), uri, spool, config.experiment, online=False), uri,
                      None)
