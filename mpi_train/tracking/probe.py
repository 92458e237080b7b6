"""Is the tracking server up? One question, asked the same way by the job, the spool, the replay, the server command
and the tests."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from ..config import redact_uri
from ..errors import UserError

STARTUP_PROBE_S = 5.0  # before a job starts: an unreachable server is reported well within 30 s, before training
OUTAGE_PROBE_S = 2.0  # one /health request while a running job thinks the server is down
# what the resolver says of a host name it does not know (glibc's words, and macOS's)
UNRESOLVED = re.compile(r"Name or service not known|nodename nor servname|No address associated|Temporary failure in "
                        r"name resolution")


class ServerUnreachable(UserError):
    """No tracking server answers at `uri`; `what` says so in one sentence, without the fix the full message adds."""

    def __init__(self, message: str, what: str, uri: str):
        super().__init__(message)
        self.what, self.uri = what, uri


def health_url(uri: str) -> str:
    parts = urlsplit(uri)
    netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))


def _ask(url: str, timeout_s: float) -> str | None:
    """None if `url` answers 200 within `timeout_s`, else what went wrong."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (OSError, ValueError) as error:
        return str(getattr(error, "reason", None) or error)


def server_answers(uri: str, timeout_s: float = OUTAGE_PROBE_S) -> bool:
    """True if the server's /health answers 200 within `timeout_s` (one request)."""
    return _ask(health_url(uri), timeout_s) is None


def wait_for_server(uri: str, timeout_s: float, every_s: float = 1.0, gave_up=lambda: False) -> str | None:
    """Ask /health until it answers or `timeout_s` passes (or `gave_up()` is true): None once up, else the last
    problem."""
    url, deadline = health_url(uri), time.monotonic() + timeout_s
    while True:
        problem = _ask(url, max(1.0, min(deadline - time.monotonic(), 10.0)))
        if problem is None or time.monotonic() >= deadline or gave_up():
            return problem
        time.sleep(every_s)


def probe_server(uri: str, timeout_s: float = STARTUP_PROBE_S,
                 otherwise: str = "or pass --no-tracking to train without tracking") -> None:
    """Raise ServerUnreachable unless the server answers within `timeout_s`: a clear error now beats MLflow's minutes
    of retries. `otherwise`: what else the command's user may do, after the fixes for the address."""
    problem = wait_for_server(uri, timeout_s)
    if problem is None:
        return
    parts = urlsplit(uri)
    what = (f"No MLflow tracking server answers at {redact_uri(uri)} "
            f"(asked {health_url(uri)} for {timeout_s:.0f} s: {problem}).")
    if UNRESOLVED.search(problem):
        fix = f"The host name {parts.hostname} does not resolve here: correct --tracking-uri or $MLFLOW_TRACKING_URI"
    elif parts.scheme == "https" and "WRONG_VERSION_NUMBER" in problem:
        fix = (f"Something there answers plain HTTP, not HTTPS: write http://{parts.netloc} in --tracking-uri or "
               f"$MLFLOW_TRACKING_URI")
    else:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        fix = (f"Start one with `python -m mpi_train server --host {parts.hostname} --port {port}`, correct "
               f"--tracking-uri or $MLFLOW_TRACKING_URI")
    raise ServerUnreachable(f"{what} {fix}, {otherwise}.", what, uri)
