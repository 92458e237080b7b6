"""A job under --resume auto is a series of attempts of one run: which run an attempt continues, and how the runs
record each restart (a count, the cause of each and the supervisor's reason for it, the ranks that left, came back
or joined)."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .spool import OFFLINE_PREFIX, server_run_id
from .store import Connection

ATTEMPTS_TAG, RESTART_TAG = "mpi_train.attempts", "mpi_train.restart"  # an attempt's count, and each restart's cause
# under --resume auto: the ranks the job trains on now (the world_size param is the first attempt's), and on the run
# of a rank the job went on without (--reshard), from when
WORLD_SIZE_TAG, LEFT_TAG = "mpi_train.world_size", "mpi_train.left"
# under --resume auto, beside the checkpoints: the run the job opened, which an attempt relaunched before the first
# checkpoint (so with nothing to resume) continues
RUN_FILE = "mlflow-run.json"
# beside the checkpoints: why the supervisor relaunches the job, written by it just before (lab/supervise.py), and
# read once by the attempt it starts
RELAUNCH_FILE = "relaunch.json"
# on the run of a rank: back in the job after it went on without the rank (LEFT_TAG), or in it since a later attempt
REJOINED_TAG, JOINED_TAG = "mpi_train.rejoined", "mpi_train.joined"
REASON_CHARS = 1000  # of a relaunch's reason, kept in the restart tag (a run tag's value holds 8000 in MLflow)
DIVERGED_TAG = "mpi_train.diverged"  # the step whose loss or weights went inf or NaN (preemption.py)
FAILURE_TAGS = ("mpi_train.failed_rank", "mpi_train.failed_host", "mpi_train.error", "mpi_train.killed_by",
                "mpi_train.unreachable_hosts", "mpi_train.unreachable_ranks", "mpi_train.requeued", DIVERGED_TAG)


def started_run(checkpoint_dir: str) -> str | None:
    """The parent run a job under --resume auto opened in `checkpoint_dir` (RUN_FILE), if any."""
    try:
        return json.loads((Path(checkpoint_dir) / RUN_FILE).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class Relaunch:
    """Why the supervisor relaunched the job (RELAUNCH_FILE): its words, and whether it stopped the job to grow it."""

    reason: str
    grow: bool = False


def taken_relaunch(checkpoint_dir: str) -> Relaunch | None:
    """The supervisor's RELAUNCH_FILE in `checkpoint_dir`, removed once read: a later restart it did not cause must
    not repeat its reason. A malformed one is removed and named on stderr; the job goes on without it."""
    path = Path(checkpoint_dir) / RELAUNCH_FILE
    try:
        text = path.read_bytes()
    except OSError:  # none: this attempt was not started by the supervisor's relaunch
        return None
    with contextlib.suppress(OSError):
        path.unlink()
    try:
        note = json.loads(text)
    except ValueError as error:  # UnicodeDecodeError included
        problem = f"not JSON: {error}"
    else:
        reason = note.get("reason") if isinstance(note, dict) else None
        grow = note.get("grow", False) if isinstance(note, dict) else None
        if isinstance(reason, str) and reason.strip() and isinstance(grow, bool):
            return Relaunch(reason=reason.strip()[:REASON_CHARS], grow=grow)
        problem = f"reason {reason!r}, grow {grow!r}" if isinstance(note, dict) else "not a JSON object"
    print(f"mpi_train: warning: {path} could not be read as the supervisor's note on why it relaunched the job "
          f"({problem}); it was removed, and the restart is recorded without its reason. The supervisor writes it "
          f'as {{"reason": "host(s) H returned", "grow": true}} just before a relaunch; remove whatever else writes '
          f"{RELAUNCH_FILE} into --checkpoint-dir.", file=sys.stderr, flush=True)
    return None


def restart_cause(status: str, tags: dict) -> str:
    """How an attempt ended, from its run's status and the tags end() set: `FAILED (rank 1 on h2: Error: ...)`."""
    if tags.get("mpi_train.requeued"):
        return f"{status} ({tags['mpi_train.requeued']})"
    if tags.get("mpi_train.killed_by"):
        return f"{status} ({tags['mpi_train.killed_by']})"
    if tags.get("mpi_train.unreachable_hosts"):
        return (f"{status} (unreachable: host(s) {tags['mpi_train.unreachable_hosts']}, ranks "
                f"{tags.get('mpi_train.unreachable_ranks', '?')})")
    if tags.get("mpi_train.failed_rank"):
        where = f"rank {tags['mpi_train.failed_rank']} on {tags.get('mpi_train.failed_host', '?')}"
        return f"{status} ({where}: {tags.get('mpi_train.error', '')})"[:1000]
    return status if status != "RUNNING" else "without recording its end (its rank 0 and guard were both gone)"


class AttemptRuns:
    """MlflowTracker's part that finds and reopens the runs of the attempt before (it sets `client`, `parent_id`,
    `child_ids`, `resumed_step` and `attempt`, and creates a rank's run with `_create_child`)."""

    def _previous_attempt(self, connection: Connection, checkpoint_dir: str, resumed_from: dict | None,
                          world_size: int) -> tuple[str, list[str]] | None:
        """Under --resume auto: the parent and rank runs this attempt continues (_reopen), and why the supervisor
        relaunched it, if it did (RELAUNCH_FILE, taken whether or not a run is continued)."""
        self.relaunch = taken_relaunch(checkpoint_dir)
        if resumed_from:
            return self._reopen(connection, resumed_from["run_id"], resumed_from.get("world_size", world_size))
        # a first checkpoint never came: continue the run of the attempt that failed before it
        return self._reopen(connection, started_run(checkpoint_dir), world_size, unfinished=True)

    def _reopen(self, connection: Connection, run_id: str | None, world_size: int,
                unfinished: bool = False) -> tuple[str, list[str]] | None:
        """The parent and rank runs of the attempt whose checkpoint this job resumes (or, `unfinished`, of one that
        failed before its first checkpoint), if they are on this server in this experiment with one child per rank
        it had; None: a new run (linked to it by tags, as an explicit --resume is)."""
        if not run_id or run_id.startswith(OFFLINE_PREFIX) or not connection.online:
            return None  # untracked, or trained offline: its run is not on the server under that id
        try:
            parent = self.client.get_run(run_id)
            if parent.info.experiment_id != connection.experiment_id or parent.info.lifecycle_stage != "active":
                return None
            if unfinished and parent.info.status not in ("FAILED", "KILLED"):
                return None  # a job that finished (its checkpoints since removed), or one still running
            children = self.client.search_runs(
                [connection.experiment_id],
                f"tags.mlflow.parentRunId = '{run_id}' and tags.`mpi_train.role` = 'rank'", max_results=1000)
        except Exception:  # noqa: BLE001 - gone, or unreadable: a new run is the safe answer
            return None
        if unfinished:  # no checkpoint says how many ranks the attempt had: its run does
            world_size = int(parent.data.tags.get(WORLD_SIZE_TAG) or parent.data.params.get("world_size")
                             or world_size)
        # ranks an earlier attempt went on without (--reshard) keep their runs, tagged LEFT_TAG, and are not
        # counted unless the checkpoint's job had them; a rank back in the job reopens its run (_rank_runs)
        by_rank = {int(child.data.tags["rank"]): child.info.run_id for child in children
                   if LEFT_TAG not in child.data.tags or int(child.data.tags["rank"]) < world_size}
        if sorted(by_rank) != list(range(world_size)):
            return None
        self.previous = parent
        self.left_ids = {int(child.data.tags["rank"]): child.info.run_id for child in children
                         if LEFT_TAG in child.data.tags}
        return run_id, [by_rank[rank] for rank in range(world_size)]

    def _restart_runs(self, connection: Connection, ranks: list[dict], tags: dict) -> None:
        """The attempt before this one ended (FAILED, KILLED, or requeued): count it, keep its cause (and the
        supervisor's reason for the relaunch) in a tag, clear its failure tags, and mark the runs RUNNING again. On
        fewer ranks (--reshard), the runs of the ranks gone keep how they ended and say when they left; on more,
        the ranks back reopen theirs and the new ranks get runs of their own (_rank_runs)."""
        from mlflow.entities import RunTag

        previous, relaunch = self.previous.data.tags, self.relaunch
        self.attempt = int(previous.get(ATTEMPTS_TAG, "1")) + 1
        step = self.resumed_step
        if relaunch and relaunch.grow and previous.get("mpi_train.requeued"):
            cause = f"{self.previous.info.status} (stopped by the supervisor at step {step} to grow)"
        else:
            cause = restart_cause(self.previous.info.status, previous)
        before, now = len(self.child_ids), len(ranks)
        went_on = f"resumed from step {step}" if step else "started again (no checkpoint yet)"
        if now != before:
            went_on += f" on {now} ranks (was {before})"
        if relaunch:
            went_on += f": {relaunch.reason}"
        tags.update({ATTEMPTS_TAG: str(self.attempt), WORLD_SIZE_TAG: str(now),
                     f"{RESTART_TAG}.{self.attempt - 1}": f"attempt {self.attempt - 1} ended {cause}; attempt "
                                                          f"{self.attempt} {went_on}"})
        for child_id in self.child_ids[now:]:
            self.client.set_tag(child_id, LEFT_TAG, f"the job went on without this rank from step {step or 0} "
                                                    f"(attempt {self.attempt}, on {now} ranks)")
        self.child_ids = self.child_ids[:now]
        for key in FAILURE_TAGS:
            if key in previous:
                self.client.delete_tag(self.parent_id, key)
        self.client.update_run(self.parent_id, status="RUNNING")
        self.client.log_batch(self.parent_id, tags=[RunTag(k, str(v)) for k, v in tags.items()], synchronous=True)
        self._rank_runs(connection, ranks)

    def _rank_runs(self, connection: Connection, ranks: list[dict]) -> None:
        """Each rank's run for this attempt, RUNNING with its host and pid: the run it had, one the job had gone on
        without (LEFT_TAG) reopened and tagged REJOINED_TAG, or for a rank new to the job a new run tagged
        JOINED_TAG."""
        from mlflow.entities import RunTag

        step, left = self.resumed_step or 0, set(self.left_ids.values())
        for rank, who in enumerate(ranks):
            known = rank < len(self.child_ids)
            run_id = self.child_ids[rank] if known else self.left_ids.get(rank)
            if run_id is None:
                run_id = self._create_child(connection, who)
                self.client.set_tag(run_id, JOINED_TAG, f"attempt {self.attempt}, from step {step}")
                self.child_ids.append(run_id)
                continue
            rank_tags = [RunTag(key, str(who[key])) for key in ("host", "pid")]
            if run_id in left:
                self.client.delete_tag(run_id, LEFT_TAG)
                rank_tags.append(RunTag(REJOINED_TAG, f"rejoined from step {step} (attempt {self.attempt})"))
            self.client.update_run(run_id, status="RUNNING")
            self.client.log_batch(run_id, tags=rank_tags, synchronous=True)
            if not known:
                self.child_ids.append(run_id)

    def _continued_run(self, connection: Connection, run_id: str | None) -> str:
        """The resumed checkpoint's run, by the server's id once a job that trained offline has been replayed."""
        if not run_id:
            return "unknown (the checkpoint's job was not tracked)"
        if not run_id.startswith(OFFLINE_PREFIX) or not connection.online:
            return run_id
        try:
            found = server_run_id(self.client, connection.experiment_id, run_id)
        except Exception:  # noqa: BLE001 - a lookup failure must not stop the job
            found = None
        return found or f"{run_id} (its job trained offline and has not been replayed yet)"
