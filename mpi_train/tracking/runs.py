"""Rank 0's tracker: the job's parent run and one child run per rank, fed from the loop, ended in exactly one status.

The loop's calls only queue metrics (the sender's thread sends them); a failure on
another rank arrives through the job's TCPStore, a signal through a wake-up pipe, and
the guard process records the end if this process dies first.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from ..advice.cache import described
from ..config import RESUME_AUTO, JobInfo, TrainConfig, field_kinds, job_file, redact_uri
from ..errors import UserError, raised_in_collective
from ..files import write_json_atomically
from ..models import example, resolve
from . import links, names
from .sampler import HostSampler
from .sender import END_TIMEOUT_S, BatchSender
from .spool import OFFLINE_PREFIX, SpoolingClient, first_line, server_run_id
from .store import Connection
from .tracker import ACK_KEY, ENDED_KEY, FAILURE_KEY, NullTracker

ATTEMPTS_TAG, RESTART_TAG = "mpi_train.attempts", "mpi_train.restart"  # an attempt's count, and each restart's cause
# under --resume auto: the ranks the job trains on now (the world_size param is the first attempt's), and on the run
# of a rank the job went on without (--reshard), from when
WORLD_SIZE_TAG, LEFT_TAG = "mpi_train.world_size", "mpi_train.left"
# under --resume auto, beside the checkpoints: the run the job opened, which an attempt relaunched before the first
# checkpoint (so with nothing to resume) continues
RUN_FILE = "mlflow-run.json"
DIVERGED_TAG = "mpi_train.diverged"  # the step whose loss or weights went inf or NaN (preemption.py)
FAILURE_TAGS = ("mpi_train.failed_rank", "mpi_train.failed_host", "mpi_train.error", "mpi_train.killed_by",
                "mpi_train.unreachable_hosts", "mpi_train.unreachable_ranks", "mpi_train.requeued", DIVERGED_TAG)
SECRET_WORDS = ("TOKEN", "PASSWORD", "SECRET", "KEY", "CREDENTIAL", "AUTH")
# TrainConfig's fields that are not params of a job's run, each a path or an output switch: none changes what the job
# computes, or how fast. Every other field is a param, so two runs that differ by any other option differ in MLflow.
NOT_PARAMS = (
    "summary_json", "timeline_dir", "checkpoint_dir",  # where the job writes its outputs
    "resume",  # the checkpoint it continues: tags resumed_from, resumed_from_checkpoint
    "calibration",  # a bench JSON, read only for the predicted sync time (metric time/predicted_sync_s)
    "tracking_uri", "experiment", "run_name",  # where and as what the run is recorded: MLflow shows them
    "no_tracking", "save_model", "tracking_spool",  # output switches (a recorded run has no_tracking off)
)
# what the job turned out to be (JobInfo), logged over the option where both name one (backend auto: the one chosen)
JOB_PARAMS = ("world_size", "batch_size_per_rank", "hosts", "rendezvous", "num_hosts", "ranks_per_host", "backend",
              "threads", "compression", "advice", "precision")
PARAMS = (*(name for name in field_kinds() if name not in NOT_PARAMS), *JOB_PARAMS)
PARAMS_PER_BATCH = 100  # the most params MLflow takes in one log_batch
CONFIG_FILE = "config.toml"  # the artifact holding the job as a job file: --config reruns it


def run_params(config: TrainConfig, job: JobInfo, hosts: list[str]) -> dict:
    """The job's run's params: each option in PARAMS as the job ran it (unset ones left out) and what the job turned
    out to be."""
    params = {**{k: v for k, v in config.as_dict().items() if k in PARAMS and v is not None},
              **{k: v for k, v in job.as_dict().items() if k in JOB_PARAMS}}
    params["hosts"] = ",".join(sorted(set(hosts)))
    return params


def checked_failure(posted: bytes) -> dict:
    """A failure report another rank posted in the store (tracker.RankTracker): JSON with its rank, host and
    traceback, or a UserError naming the key; nothing else is read from it."""
    try:
        failure = json.loads(bytes(posted).decode())
        if (isinstance(failure, dict) and isinstance(failure.get("rank"), int) and isinstance(failure.get("host"), str)
                and isinstance(failure.get("traceback"), str)):
            return failure
        reason = "not a report of a rank, its host and its traceback"
    except (UnicodeDecodeError, ValueError) as error:
        reason = f"{type(error).__name__}: {error}"
    raise UserError(f"the value under the store key {FAILURE_KEY!r} is garbled or forged ({reason}); it was refused "
                    f"and nothing of it ran", collective=False)


def started_run(checkpoint_dir: str) -> str | None:
    """The parent run a job under --resume auto opened in `checkpoint_dir` (RUN_FILE), if any."""
    try:
        return json.loads((Path(checkpoint_dir) / RUN_FILE).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
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


def job_metrics(summary: dict, global_batch: int) -> dict:
    """The whole-job figures of a finished job's summary, under the parent run's `summary/` names (names.py):
    one steady-state mean per phase (names.SUMMARY_RULE), and the run's outcome."""
    steady = summary.get("mean_times_after_warmup") or summary["mean_times"]
    step_s = steady["step_time_s"]
    figures = {
        **{names.summary_key(phase): value for phase, value in steady.items()},
        names.summary_key("samples_per_s"): global_batch / step_s if step_s else 0.0,
        names.summary_key("sync_share"): steady["sync_time_s"] / step_s if step_s else 0.0,
        names.summary_key("total_steps"): summary["total_steps"],
        names.summary_key("wall_time_s"): summary["wall_time_s"],
        **({names.COMPILE_TIME: summary["compile_s"]} if summary.get("compile_s") is not None else {}),
    }
    if summary["final_loss"] is not None:
        figures[names.summary_key("final_loss")] = summary["final_loss"]
    if summary.get("epochs"):
        figures[names.summary_key("test_accuracy")] = summary["epochs"][-1]["test_accuracy"]
        figures[names.summary_key("test_loss")] = summary["epochs"][-1]["test_loss"]
    figures.update({names.summary_key(key): value for key, value in summary.get("throughput", {}).items()
                    if key in names.THROUGHPUT})
    if "predicted_sync_time_s" in summary:
        figures[names.summary_key("predicted_sync_s")] = summary["predicted_sync_time_s"]
    if "prediction_fit_error" in summary:  # the worst calibration fit behind it (a compared plot says when rough)
        figures[names.summary_key("prediction_fit_error")] = summary["prediction_fit_error"]
    split = summary.get("sync_split_after_warmup")
    if split:
        figures.update({names.summary_key(key): split["mean"][key] for key in names.SPLIT})
        figures[names.summary_key("slowest_rank")] = split["slowest_rank"]
    if summary.get("recorder_busy_s"):  # the split's own cost (and a timeline's), as tracking_share is tracking's
        loop_s = summary["mean_times"]["step_time_s"] * summary["total_steps"]
        busy_s = statistics.fmean(summary["recorder_busy_s"])
        figures[names.summary_key("recorder_share")] = busy_s / loop_s if loop_s else 0.0
    shown = summary.get("timeline") or {}
    if shown.get("wire_s_per_step"):  # every collective's time on the wire, the timeline's steps: beside the model's
        figures[names.summary_key("wire_s")] = sum(shown["wire_s_per_step"].values())
        if shown.get("predicted_wire_s_per_step"):
            figures[names.summary_key("predicted_wire_s")] = sum(shown["predicted_wire_s_per_step"].values())
    if summary.get("clock_alignment"):
        figures[names.summary_key("clock_error_s")] = max(rank["error_s"] for rank in summary["clock_alignment"])
    held = summary.get("memory") or {}
    figures.update({names.memory_key(key): value for key, value in held.get("most", {}).items()})
    if held.get("predicted"):
        figures[names.memory_key("predicted_total_bytes")] = held["predicted"]["total_bytes"]
    if summary.get("slow_host"):
        figures[names.summary_key("slow_host_cost_s")] = summary["slow_host"]["cost_s"]
        figures[names.summary_key("slow_host_link_mb_s")] = summary["slow_host"]["bandwidth"] / 1e6
    return figures


class MlflowTracker(NullTracker):
    """Rank 0: the job's parent run and one child run per rank; ends them in exactly one terminal status."""

    def __init__(self, connection: Connection, config: TrainConfig, cluster, job: JobInfo, ranks: list[dict]):
        self.client, self.cluster, self.config = connection.client, cluster, config
        self.info, self.hosts = cluster.info, list(cluster.hosts)
        self.lock = threading.Lock()
        self.status: str | None = None
        self.lines: list[str] = []
        self.stalls: list[str] = []  # hosts that went silent and came back (log_stall)
        self.straggler = None  # a host whose link is far slower than the others' (log_straggler)
        self.loop_time_s = 0.0  # time the training loop spent in this tracker: the overhead it pays
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()
        self.ended = threading.Event()  # set once end() has recorded the outcome and sent the last metrics
        self.wakeup: tuple[int, int] | None = None

        environment = describe_environment(cluster)
        params = run_params(config, job, self.hosts)
        tags = {"mpi_train.role": "job", "mlflow.note.content": names.JOB_NOTE, "torch_version": environment["torch"],
                "mpi4py_version": environment["mpi4py"],
                "mpi_library_version": (environment["mpi_library"].splitlines()[0] if environment["mpi_library"]
                                        else "unknown"),
                "mlflow_version": environment["mlflow"], "hosts": params["hosts"]}
        if environment["git_commit"]:
            tags["mlflow.source.git.commit"] = environment["git_commit"]
        if job.advice:  # --sync auto: what it took and why (the advice file is param `advice`)
            tags["mpi_train.sync_auto"] = described(job.advice)[:5000]
        # --resume auto: this job is an attempt of one run. Its metrics wait for a checkpoint to cover them (commit),
        # so the steps a failed attempt trained past its last checkpoint reach MLflow once, from the attempt that
        # trains them again; and it continues the run of the attempt it resumes.
        self.holding = config.resume == RESUME_AUTO
        self.held: list[tuple[str, list]] = []
        self.attempt = 1
        self.resumed_step = job.resumed_from["step"] if job.resumed_from else 0
        if self.holding:
            tags.update({ATTEMPTS_TAG: "1", WORLD_SIZE_TAG: str(len(ranks))})
        continued = None
        if self.holding and job.resumed_from:
            resumed = job.resumed_from
            continued = self._reopen(connection, resumed["run_id"], resumed.get("world_size", len(ranks)))
        elif self.holding:  # a first checkpoint never came: continue the run of the attempt that failed before it
            continued = self._reopen(connection, started_run(config.checkpoint_dir), len(ranks), unfinished=True)
        if job.resumed_from and not continued:  # the run this job continues, and where
            resumed = job.resumed_from
            tags.update({"resumed_from": self._continued_run(connection, resumed["run_id"]),
                         "resumed_from_step": str(resumed["step"]), "resumed_from_checkpoint": resumed["checkpoint"]})
        self.parent_id, self.child_ids = continued or (None, [])
        try:
            if continued:
                self._restart_runs(connection, ranks, tags)
            else:
                self._create_runs(connection, config, params, tags, ranks)
            if self.holding and connection.online and not continued:
                write_json_atomically(str(Path(config.checkpoint_dir) / RUN_FILE), {"run_id": self.parent_id})
            self.client.log_dict(self.parent_id, config.as_dict(), "config.json")
            self.client.log_text(self.parent_id, job_file(config, len(ranks)), CONFIG_FILE)
            self.client.log_dict(self.parent_id, environment, "environment.json")
        except BaseException:  # never leave a half-made job RUNNING
            self._fail_all()
            raise
        self.uri, self.experiment_id = connection.uri, connection.experiment_id
        if connection.online:
            links.share_views(self.client, self.experiment_id)
        spool = self.client.spool.path if isinstance(self.client, SpoolingClient) else None
        from .guard import RunGuard  # here, not at the top: the guard's own process imports this package first

        self.guard = RunGuard(connection.uri, self.parent_id, self.child_ids, spool, config.experiment)
        self.sender = BatchSender(self.client, on_handled=self.guard.handled)
        self.sampler = HostSampler(config.system_metrics_every) if config.system_metrics_every else None
        if self.holding:  # a job that may restart, maybe on fewer ranks: each attempt's ranks, from its first step
            self._put(self.parent_id, self._metrics({names.WORLD_SIZE: len(ranks)}, self.resumed_step))

    def _create_runs(self, connection: Connection, config: TrainConfig, params: dict, tags: dict,
                     ranks: list[dict]) -> None:
        """A new parent run with its params, and one child run per rank."""
        from mlflow.entities import Param

        parent = self.client.create_run(connection.experiment_id,
                                        run_name=config.default_run_name(self.info.world_size), tags=tags)
        self.parent_id = parent.info.run_id
        logged = [Param(k, str(v)) for k, v in sorted(params.items())]
        for start in range(0, len(logged), PARAMS_PER_BATCH):
            self.client.log_batch(self.parent_id, params=logged[start:start + PARAMS_PER_BATCH], synchronous=True)
        for who in ranks:
            self.child_ids.append(self._create_child(connection, who))

    def _create_child(self, connection: Connection, who: dict) -> str:
        """One rank's run under the parent."""
        from mlflow.entities import Param

        child = self.client.create_run(connection.experiment_id, run_name=f"rank{who['rank']}", tags={
            "mlflow.parentRunId": self.parent_id, "mpi_train.role": "rank",
            **{key: str(who[key]) for key in ("rank", "local_rank", "host", "pid")}})
        self.client.log_batch(child.info.run_id, params=[Param("seed", str(self.config.seed))], synchronous=True)
        return child.info.run_id

    def _fail_all(self) -> None:
        for run_id in [*self.child_ids, *([self.parent_id] if self.parent_id else [])]:
            try:
                self.client.set_terminated(run_id, "FAILED")
            except Exception:  # noqa: BLE001, S110 - the original error matters more
                pass

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
        # ranks an earlier attempt went on without (--reshard) keep their runs, tagged LEFT_TAG, and are not
        # counted unless the checkpoint's job had them
        by_rank = {int(child.data.tags["rank"]): child.info.run_id for child in children
                   if LEFT_TAG not in child.data.tags or int(child.data.tags["rank"]) < world_size}
        if sorted(by_rank) != list(range(world_size)):
            return None
        self.previous = parent
        return run_id, [by_rank[rank] for rank in range(world_size)]

    def _restart_runs(self, connection: Connection, ranks: list[dict], tags: dict) -> None:
        """The attempt before this one ended (FAILED, KILLED, or requeued): count it, keep its cause in a tag,
        clear its failure tags, and mark the runs RUNNING again. On fewer ranks (--reshard), the runs of the ranks
        gone keep how they ended and say when they left; on more, the new ranks get runs of their own."""
        from mlflow.entities import RunTag

        previous = self.previous.data.tags
        self.attempt = int(previous.get(ATTEMPTS_TAG, "1")) + 1
        cause = restart_cause(self.previous.info.status, previous)
        step = self.resumed_step
        before, now = len(self.child_ids), len(ranks)
        went_on = f"resumed from step {step}" if step else "started again (no checkpoint yet)"
        if now != before:
            went_on += f" on {now} ranks (was {before})"
        tags.update({ATTEMPTS_TAG: str(self.attempt), WORLD_SIZE_TAG: str(now),
                     f"{RESTART_TAG}.{self.attempt - 1}": f"attempt {self.attempt - 1} ended {cause}; attempt "
                                                          f"{self.attempt} {went_on}"})
        for child_id in self.child_ids[now:]:
            self.client.set_tag(child_id, LEFT_TAG, f"the job went on without this rank from step {step} "
                                                    f"(attempt {self.attempt}, on {now} ranks)")
        self.child_ids = self.child_ids[:now]
        for key in FAILURE_TAGS:
            if key in previous:
                self.client.delete_tag(self.parent_id, key)
        self.client.update_run(self.parent_id, status="RUNNING")
        self.client.log_batch(self.parent_id, tags=[RunTag(k, str(v)) for k, v in tags.items()], synchronous=True)
        for who, child_id in zip(ranks, self.child_ids):
            self.client.update_run(child_id, status="RUNNING")
            self.client.log_batch(child_id, tags=[RunTag(key, str(who[key])) for key in ("host", "pid")],
                                  synchronous=True)
        for who in ranks[before:]:
            self.child_ids.append(self._create_child(connection, who))

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

    # -- the training loop's calls: queue only, never the network --------------------------------------

    def _metrics(self, values: dict, step: int) -> list:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        return [Metric(key, float(value), now, step) for key, value in values.items()
                if isinstance(value, (int, float))]

    def _put(self, run_id: str, metrics: list) -> None:
        """Queue metrics for the sender, and give the guard a copy in case this process dies first (under
        --resume auto, once a checkpoint covers them: commit)."""
        if self.holding:
            self.held.append((run_id, metrics))
        else:
            self._send(run_id, metrics)

    def _send(self, run_id: str, metrics: list) -> None:
        self.guard.keep(run_id, metrics)
        self.sender.put(run_id, metrics)

    def commit(self) -> None:
        """A checkpoint is on disk: what was logged up to it is what a resumed attempt will not train again."""
        held, self.held = self.held, []
        for run_id, metrics in held:
            self._send(run_id, metrics)

    def unsent(self) -> list[tuple]:
        return [(run_id, m.key, m.value, m.timestamp, m.step) for run_id, metrics in self.held for m in metrics]

    def resend(self, points: list[tuple]) -> None:
        """The previous attempt may have died between writing its checkpoint and sending what it covers (commit):
        send it again. MLflow stores a point sent twice (same key, step, time and value) once."""
        from mlflow.entities import Metric

        by_run: dict[str, list] = {}
        for run_id, key, value, timestamp, step in points:
            if not run_id.startswith(OFFLINE_PREFIX):  # an offline attempt's points are in its spool
                by_run.setdefault(run_id, []).append(Metric(key, value, timestamp, step))
        for run_id, metrics in by_run.items():
            self._send(run_id, metrics)

    def console(self, line: str) -> None:
        self.lines.append(line)

    def where(self) -> str | None:
        if self.experiment_id is None:  # trained offline: the spool's message says how to send it
            return None
        return links.where(self.uri, self.experiment_id, self.parent_id, charts=True)

    def log_stall(self, stall) -> None:
        """A host that went silent and came back (liveness.Stall): a metric at its step on the job and its ranks,
        and a tag listing every stall when the run ends."""
        self.stalls.append(stall.describe())
        for run_id in [self.parent_id, *(self.child_ids[rank] for rank in stall.ranks)]:
            self._put(run_id, self._metrics({names.STALL: stall.seconds}, stall.step))

    def log_straggler(self, straggler) -> None:
        """A slow host found at start (stragglers.Straggler): tags naming it when the run ends."""
        self.straggler = straggler

    def log_step(self, epoch, step, loss, times, throughput, per_rank, lr=None) -> None:
        started = time.perf_counter()
        self._put(self.parent_id, self._metrics({
            names.LOSS: loss, names.SAMPLES_PER_S: throughput, **({names.LR: lr} if lr is not None else {}),
            **{names.step_key(key): times[key] for key in (*names.PHASES, *names.SPLIT, *names.THROUGHPUT,
                                                             "slowest_rank") if key in times},
            **({names.PREDICTED_SYNC: times["predicted_sync_time_s"]} if "predicted_sync_time_s" in times else {}),
            **({names.DRIFT: times["drift"]} if "drift" in times else {}),
            **{names.learning_key(key): times[key] for key in names.GRADIENT_FIGURES if key in times},
        }, step))
        for rank, record in enumerate(per_rank):
            self._put(self.child_ids[rank],
                      self._metrics({names.rank_key(k): v for k, v in record.items() if k != "system"}, step))
            if record.get("system"):
                host = self.hosts[rank]
                self._put(self.parent_id,
                          self._metrics({f"system/{host}/{k}": v for k, v in record["system"].items()}, step))
        self.loop_time_s += time.perf_counter() - started

    def log_epoch(self, epoch, step, test_loss, test_accuracy, epoch_time_s) -> None:
        """An epoch's time, at the step it ended, so it charts on the same axis as the loss (its test figures come
        with log_eval)."""
        self._put(self.parent_id, self._metrics({names.EPOCH_TIME: epoch_time_s}, step))

    def log_eval(self, step, test_loss, test_accuracy, elapsed_s, sent_mb, perplexity=None) -> None:
        """A test evaluation at `step` with the time and bytes it took to get there (an epoch's end's too), and a
        language model's perplexity."""
        scored = {names.PERPLEXITY: perplexity} if perplexity is not None else {}
        self._put(self.parent_id, self._metrics({names.TEST_LOSS: test_loss, names.TEST_ACCURACY: test_accuracy,
                                                 names.ELAPSED: elapsed_s, names.SENT_MB: sent_mb, **scored}, step))

    def finish(self, summary: dict) -> None:
        means, steps = summary["mean_times"], summary["total_steps"]
        step_time_total = means["step_time_s"] * steps
        self.commit()  # the job's end: nothing it logged will be trained again
        self.holding = False
        self._put(self.parent_id, self._metrics({
            **job_metrics(summary, self.config.batch_size),
            names.summary_key("restarts"): self.attempt - 1,
            names.summary_key("tracking_loop_s"): self.loop_time_s,
            names.summary_key("tracking_share"): self.loop_time_s / step_time_total if step_time_total else 0.0,
        }, 0))
        steady = summary.get("per_rank_mean_times_after_warmup") or summary["per_rank_mean_times"]
        split = summary.get("sync_split_after_warmup", {}).get("per_rank") or [{} for _ in steady]
        held = summary.get("memory", {}).get("per_rank") or [{} for _ in steady]
        for rank, (rank_means, rank_split, rank_held) in enumerate(zip(steady, split, held)):
            figures = {**rank_means, **rank_split}
            self._put(self.child_ids[rank],
                      self._metrics({**{names.rank_summary_key(key): value for key, value in figures.items()},
                                     **{names.memory_key(key): value for key, value in rank_held.items()}}, 0))
        self.client.log_dict(self.parent_id, summary, "summary.json")

    def requeue(self, reason: str) -> None:
        self.commit()
        self.end("KILLED", tags={"mpi_train.requeued": reason})

    def diverged(self, step: int, rank: int, message: str) -> None:
        """Ended as a failure of `rank`, with `message` in place of a traceback (no bug to trace)."""
        self.end("FAILED", tags={DIVERGED_TAG: str(step)},
                 failure={"rank": rank, "host": self.hosts[rank], "traceback": message})

    def log_artifact(self, path, folder: str) -> None:
        self.client.log_artifact(self.parent_id, str(path), folder)

    MODEL_NAME = "model"  # what --save-model logs: runs:/<run id>/model loads it
    EXAMPLE_BATCH = 2  # samples in the model's input example: more than one, so the saved model takes any batch size

    def save_weights(self, state: dict) -> str | None:
        """The trained model as an MLflow PyTorch model, which mlflow.pytorch.load_model("runs:/<run id>/model") loads
        and the Model Registry takes: the job's model built afresh with `state` (its whole state_dict on CPU,
        SyncMethod.model_state), in eval mode, with an input example of the data's shape (whence its signature).
        It is a logged model of the job's run; a server that is away, or cannot take logged models (MLflow 2), gets
        the same files as the run's artifacts under model/, sent or spooled like any artifact, which the same URI
        loads once they are on the server. Where it can be loaded from now, if anywhere (not while spooled)."""
        import torch

        with torch.random.fork_rng(devices=[]):  # building draws initial weights: the job's streams stay as they were
            model = self.config.make_model()
        model.load_state_dict(state)
        inputs = example(resolve(self.config.model_name), self.config.input_shape, self.EXAMPLE_BATCH)[0]
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / self.MODEL_NAME
            # a run made offline gets its server's id from the replay: the files cannot name it
            offline = self.parent_id.startswith(OFFLINE_PREFIX)
            save_model_files(model.eval(), inputs.numpy(), path, None if offline else self.parent_id)
            uri = f"runs:/{self.parent_id}/{self.MODEL_NAME}"
            if self._server_up() and self._log_model(path):
                return uri
            for file in sorted(found for found in path.rglob("*") if found.is_file()):  # sent, or spooled
                self.client.log_artifact(self.parent_id, str(file),
                                         str(self.MODEL_NAME / file.parent.relative_to(path)))
            return uri if self._server_up() else None

    def _server_up(self) -> bool:
        """Writes reach the store now: the job did not train offline, and no outage is being spooled."""
        return self.experiment_id is not None and not getattr(self.client, "down", False)

    def _log_model(self, path: Path) -> str | None:
        """The MLflow model saved at `path` logged as a model of the job's run (MLflow 3's LoggedModel, listed with
        the run's params in the experiment's Models tab): its id; None, said on stderr, where the store did not
        take it."""
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus
        from mlflow.models import Model

        logged = None
        try:
            logged = self.client.create_logged_model(self.experiment_id, self.MODEL_NAME, self.parent_id,
                                                     params=self.client.get_run(self.parent_id).data.params)
            saved = Model.load(str(path))  # as mlflow.pytorch.log_model writes it: the MLmodel names its model
            saved.model_id = saved.model_uuid = logged.model_id
            saved.artifact_path = logged.artifact_location
            saved.save(str(path / "MLmodel"))
            self.client.log_model_artifacts(logged.model_id, str(path))
            self.client.log_outputs(self.parent_id, [LoggedModelOutput(logged.model_id, step=0)])
            self.client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
            return logged.model_id
        except Exception as error:  # noqa: BLE001 - the run's artifacts take the files instead
            if logged is not None:
                with contextlib.suppress(Exception):
                    self.client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
            print(f"mpi_train: warning: MLflow did not take the trained model as a logged model of run "
                  f"{self.parent_id} ({first_line(error)}); it is stored with the run's artifacts under "
                  f"{self.MODEL_NAME}/ instead, which mlflow.pytorch.load_model(\"runs:/{self.parent_id}/"
                  f"{self.MODEL_NAME}\") loads as well.", file=sys.stderr, flush=True)
            return None

    # -- lifetime: started by `with`, ended once -------------------------------------------------------

    def __enter__(self):
        if self.info.world_size > 1 and self.cluster.store is not None:
            self._thread(self._watch_failures, "mpi_train-failure-watch")
        if threading.current_thread() is threading.main_thread():
            self._catch_signals()
        return self

    def __exit__(self, kind, error, trace) -> bool:
        if error is None:
            self.end("FINISHED")
        elif isinstance(error, KeyboardInterrupt):
            self.end("KILLED", tags={"mpi_train.killed_by": "KeyboardInterrupt"})
        else:
            rank, host = self.info.rank, self.info.host
            text = "".join(traceback.format_exception(kind, error, trace))
            if raised_in_collective(error) and not self.cluster.liveness.silent():
                # rank 0 only saw a peer's failure: blame the rank that was behind (a silent host, end() blames)
                behind = self.cluster.laggards()
                rank, host = (behind[0], self.cluster.hosts[behind[0]]) if behind else ("unknown", "unknown")
                text = (f"A collective failed on rank {self.info.rank} ({self.info.host}); rank {rank} was behind.\n"
                        f"{text}")
            self.end("FAILED", failure={"rank": rank, "host": host, "traceback": text})
        self._release_signals()
        self._report_spool()
        return False

    def _report_spool(self, try_again: bool = True) -> None:
        """One last try at sending what an outage spooled (unless there is no time for one: a signal); if the
        server is still away, say how to send it later."""
        if (not hasattr(self.client, "retry") or (try_again and self.client.retry(now=True))
                or not self.client.pending()):
            return
        uri = redact_uri(self.uri)
        print(f"mpi_train: warning: the MLflow server at {uri} is still unreachable; {self.client.pending()} "
              f"write(s), the runs' end included, are kept in {self.client.spool.path}. Send them with "
              f"`python -m mpi_train replay --tracking-uri {uri}` once it is up.", file=sys.stderr, flush=True)

    def end(self, status: str, tags: dict | None = None, failure: dict | None = None) -> bool:
        """End the parent and child runs in `status` (the first call wins); True if this call ended them.

        The outcome goes to the guard process first, so it is recorded even if mpirun kills
        this process midway (it follows SIGTERM with SIGKILL within a fraction of a second).
        A later call returns only once the first has recorded the end: its caller may end the
        process next (the loop's error aborts the job), which would cut the first call off
        between the runs' status and the last metrics, leaving those to the guard, which sends
        them only after the runs already show their end.
        """
        with self.lock:
            first = self.status is None
            if first:
                self.status = status
        if not first:
            self.ended.wait(END_TIMEOUT_S)
            return False
        tags = dict(tags or {})
        if self.stalls:
            tags["mpi_train.network_stalls"] = "; ".join(self.stalls)[:5000]
        if self.straggler:
            tags.update({"mpi_train.slow_host": self.straggler.host,
                         "mpi_train.slow_host_ranks": ",".join(map(str, self.straggler.ranks)),
                         "mpi_train.slow_host_link": self.straggler.describe()})
        silent = self.cluster.liveness.silent() if status == "FAILED" else []
        failed_ranks = {rank for stall in silent for rank in stall.ranks}
        if failure and silent:  # whoever reported the failure, the cause is the host that went silent
            tags.update({"mpi_train.unreachable_hosts": ",".join(stall.host for stall in silent),
                         "mpi_train.unreachable_ranks": ",".join(map(str, sorted(failed_ranks)))})
            if failure["host"] not in {stall.host for stall in silent}:
                failure = {**failure, "rank": silent[0].ranks[0], "host": silent[0].host,
                           "traceback": f"Unreachable: {'; '.join(stall.describe() for stall in silent)} "
                                        f"(reported by rank {failure['rank']} on {failure['host']}).\n"
                                        f"{failure['traceback']}"}
        failed_rank = failure["rank"] if failure else None
        failed_ranks = failed_ranks or {failed_rank}
        if failure:
            last_line = failure["traceback"].strip().splitlines()[-1] if failure["traceback"].strip() else ""
            tags.update({"mpi_train.failed_rank": str(failed_rank), "mpi_train.failed_host": failure["host"],
                         "mpi_train.error": last_line[:5000]})
            self.lines.append(f"rank {failed_rank} on {failure['host']} failed:\n{failure['traceback']}")
        child_statuses = [status if status != "FAILED" or rank in failed_ranks else "KILLED"
                          for rank in range(len(self.child_ids))]
        self.guard.announce(status, tags, child_statuses)
        self.stop.set()
        try:
            if status == "FINISHED":  # nothing is pressing: the last metrics first, then the status
                self.sender.stop()
            from mlflow.entities import RunTag

            if tags:
                self.client.log_batch(self.parent_id, tags=[RunTag(k, str(v)) for k, v in tags.items()],
                                      synchronous=True)
            for child_id, child_status in zip(self.child_ids, child_statuses):
                self.client.set_terminated(child_id, child_status)
            self.client.set_terminated(self.parent_id, status)
            if failure:
                self.client.log_text(self.parent_id, failure["traceback"], f"failure/traceback_rank{failed_rank}.txt")
            self.client.log_text(self.parent_id, "\n".join(self.lines) + "\n", "console.log")
            self.sender.stop()
        except Exception as error:  # noqa: BLE001 - say so; the job's own outcome matters more
            print(f"mpi_train: warning: could not record the MLflow run as {status}: {error}", file=sys.stderr)
        self.guard.done()
        self.ended.set()
        if self.cluster.store is not None:
            try:
                self.cluster.store.set(ENDED_KEY, status)  # signalled ranks may go now (see RankTracker)
            except Exception:  # noqa: BLE001, S110 - the store is gone: nobody is waiting on it
                pass
        return True

    def _thread(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _watch_failures(self) -> None:
        """Poll the store for a failure posted by another rank (rank 0 itself may be stuck in a collective)."""
        store = self.cluster.store
        while not self.stop.wait(0.25):
            try:
                if not store.check([FAILURE_KEY]):
                    continue
                posted = store.get(FAILURE_KEY)
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending anyway
                return
            try:
                failure = checked_failure(posted)
            except UserError as refused:  # not a rank's report: say so, drop it, keep watching
                print(f"mpi_train: warning: {refused}", file=sys.stderr, flush=True)
                store.delete_key(FAILURE_KEY)
                continue
            self.end("FAILED", failure=failure)
            store.set(ACK_KEY, "1")
            return

    def _catch_signals(self) -> None:
        """SIGTERM/SIGINT end the runs KILLED from a helper thread: the main thread may sit in C code for minutes.

        Python's C-level handler writes the signal number to a wakeup pipe from whatever thread
        receives it; the helper reads it, ends the runs and aborts the MPI job.
        """
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self.wakeup = (read_fd, write_fd, signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False))
        self.old_handlers = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
        self._thread(self._wait_for_signal, "mpi_train-signal-watch")

    def _wait_for_signal(self) -> None:
        read_fd = self.wakeup[0]
        while True:
            try:
                received = os.read(read_fd, 1)
            except OSError:
                return
            if not received or received[0] == 0:  # closed, or the stop byte from _release_signals
                return
            number = received[0]
            if number not in (signal.SIGTERM, signal.SIGINT):
                continue
            name = signal.Signals(number).name
            if self.cluster.liveness.silent():  # a launcher that lost a host's daemon stops the job: that host
                # failed, nobody killed it (end() names it)
                recorded = self.end("FAILED", failure={"rank": self.info.rank, "host": self.info.host,
                                                       "traceback": f"{name} from the launcher"})
            else:
                recorded = self.end("KILLED", tags={"mpi_train.killed_by": name})
            if recorded:
                print(f"mpi_train: {name} received; run recorded as {self.status}, stopping every rank.",
                      file=sys.stderr)
                # mpirun's SIGKILL follows within a second: no time to wait on the server
                self._report_spool(try_again=False)
            self.cluster.abort(128 + number)

    def _release_signals(self) -> None:
        if not self.wakeup:
            return
        _read_fd, write_fd, old_fd = self.wakeup
        signal.set_wakeup_fd(old_fd)
        for sig, handler in self.old_handlers.items():
            signal.signal(sig, handler)
        os.write(write_fd, b"\0")
        self.wakeup = None


def save_model_files(model, inputs, path: Path, run_id: str | None) -> str:
    """`model` saved as an MLflow PyTorch model at `path` with `inputs` (a numpy batch) as its input example: a
    torch.export program (pt2, MLflow's default: it loads with torch alone and unpickles nothing), else, for a model
    torch.export cannot trace, pickled, which loads only where the model's code imports. The format used."""
    import mlflow.pytorch
    from mlflow.models import Model

    # listed, not inferred: inferring them loads the model again in a new Python process, seconds for nothing
    options = {"input_example": inputs, "pip_requirements": mlflow.pytorch.get_default_pip_requirements()}
    try:
        mlflow.pytorch.save_model(model, str(path), mlflow_model=Model(run_id=run_id), serialization_format="pt2",
                                  **options)
        return "pt2"
    except Exception as error:  # noqa: BLE001 - whatever torch.export cannot trace in the model's forward
        shutil.rmtree(path, ignore_errors=True)
        print(f"mpi_train: warning: torch.export cannot trace the model ({first_line(error)}); it is saved pickled "
              f"instead, which loads only where {type(model).__module__} imports.", file=sys.stderr, flush=True)
    mlflow.pytorch.save_model(model, str(path), mlflow_model=Model(run_id=run_id), serialization_format="pickle",
                              **options)
    return "pickle"


def git_commit() -> str | None:
    """The project's commit (with `-dirty` if tracked files changed), or None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5,
                                check=False)
        if commit.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5, check=False).stdout.strip()
        return commit.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def describe_environment(cluster) -> dict:
    """Versions, the job's hosts as a hostfile, the MPI library and launcher settings (no secrets)."""
    import mlflow
    import torch

    try:
        # the package only: importing mpi4py.MPI would initialise MPI, which torchrun and srun jobs never do
        import mpi4py

        mpi4py_version = mpi4py.__version__
    except ImportError:
        mpi4py_version = ""
    library = ""
    if "mpi4py.MPI" in sys.modules:
        try:
            library = sys.modules["mpi4py.MPI"].Get_library_version().replace("\0", "").strip()
        except Exception:  # noqa: BLE001, S110 - the MPI library's version is only informative: left blank
            pass
    slots: dict[str, int] = {}
    for host in cluster.hosts:
        slots[host] = slots.get(host, 0) + 1
    launcher = {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_", "OMPI_COMM_WORLD_SIZE", "MASTER_ADDR",
                                 "MASTER_PORT", "GLOO_SOCKET_IFNAME", "WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                                 "SLURM_JOB_ID", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_NODELIST"))
                and not any(word in k.upper() for word in SECRET_WORDS)}
    return {
        "python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
        "mpi4py": mpi4py_version, "launcher": cluster.environment.name, "mlflow": mlflow.__version__,
        "mpi_library": library,
        "git_commit": git_commit(), "world_size": cluster.info.world_size, "hosts_by_rank": list(cluster.hosts),
        "hostfile": "".join(f"{host} slots={n}\n" for host, n in slots.items()), "launcher_env": launcher,
    }
