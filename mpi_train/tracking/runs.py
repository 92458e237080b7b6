"""Rank 0's tracker: the job's parent run and one child run per rank, fed from the loop, ended in exactly one status.

The loop's calls only queue metrics (the sender's thread sends them); a failure on another rank arrives through the
job's TCPStore, a signal through a wake-up pipe (signals.py), and the guard process records the end if this process
dies first. Its parts: the params and environment recorded (run_facts.py), the summary figures (summary_metrics.py),
the attempts of a resumed job (attempts.py) and the saved model (saved_model.py).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import traceback
from pathlib import Path

from ..advice.cache import described
from ..config import RESUME_AUTO, JobInfo, TrainConfig, job_file, redact_uri
from ..errors import UserError, raised_in_collective
from ..files import write_json_atomically
from . import links, names, signals
from .attempts import ATTEMPTS_TAG, DIVERGED_TAG, RUN_FILE, WORLD_SIZE_TAG, AttemptRuns
from .run_facts import CONFIG_FILE, PARAMS_PER_BATCH, describe_environment, run_params
from .sampler import HostSampler
from .saved_model import ModelSaving
from .sender import END_TIMEOUT_S, BatchSender
from .spool import OFFLINE_PREFIX, SpoolingClient
from .store import Connection
from .summary_metrics import job_metrics
from .tracker import ACK_KEY, ENDED_KEY, FAILURE_KEY, NullTracker


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


class MlflowTracker(AttemptRuns, ModelSaving, NullTracker):
    """Rank 0: the job's parent run and one child run per rank; ends them in exactly one terminal status."""

    def __init__(self, connection: Connection, config: TrainConfig, cluster, job: JobInfo, ranks: list[dict],
                 preemption=None):
        self.client, self.cluster, self.config = connection.client, cluster, config
        self.preemption = preemption  # SIGTERM may stop the job at a step boundary (preemption.py)
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
        self.stop_watch: signals.StopWatch | None = None  # SIGTERM and SIGINT, while the job runs

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
        continued = (self._previous_attempt(connection, config.checkpoint_dir, job.resumed_from, len(ranks))
                     if self.holding else None)
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

        self.guard = RunGuard(uri=connection.uri, parent_id=self.parent_id, child_ids=self.child_ids, spool=spool,
                              experiment=config.experiment)
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

    def unrecorded(self) -> str | None:
        refused = getattr(self.client, "unrecorded", None)  # a database store's client (store_writes.py)
        return refused() if refused else None

    # -- lifetime: started by `with`, ended once -------------------------------------------------------

    def __enter__(self):
        if self.info.world_size > 1 and self.cluster.store is not None:
            self._thread(self._watch_failures, "mpi_train-failure-watch")
        if signals.on_main_thread():
            self.stop_watch = signals.StopWatch(self._signalled)
        return self

    def __exit__(self, kind, error, trace) -> bool:
        if error is None:
            self.end("FINISHED")
        elif isinstance(error, KeyboardInterrupt):
            self.end("KILLED", tags={"mpi_train.killed_by": "KeyboardInterrupt"})
        elif gone := self.cluster.launcher_lost():  # its output's reader went with it: the error is the kill's
            self.end("KILLED", tags={"mpi_train.killed_by": f"{gone} gone"})
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
        if self.stop_watch is not None:
            self.stop_watch.release()
            self.stop_watch = None
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

    def _signalled(self, number: int) -> None:
        """SIGTERM or SIGINT, on the signal watch's thread: stopped now, or SIGTERM at the next step boundary."""
        if number == signals.TERMINATE and self.preemption is not None and self.preemption.terminate_at_boundary:
            self.preemption.late_terminate = lambda: self._stopped(number)
            self.preemption.terminated()
        else:
            self._stopped(number)

    def _stopped(self, number: int) -> None:
        """SIGTERM or SIGINT, on the signal watch's thread: record the end, then abort the MPI job."""
        name = signals.name(number)
        # a launcher that lost a host's daemon stops the job: that host failed, nobody killed it (end() names it)
        if self.cluster.liveness.silent():
            recorded = self.end("FAILED", failure={"rank": self.info.rank, "host": self.info.host,
                                                   "traceback": f"{name} from the launcher"})
        else:
            # the watch's own SIGTERM, not mpirun's (mpirun exits right after it sends one)
            by = f"{self.cluster.gone_launcher} gone" if self.cluster.gone_launcher else name
            recorded = self.end("KILLED", tags={"mpi_train.killed_by": by})
        if recorded:
            with contextlib.suppress(OSError):  # a launcher gone took the reader of this rank's output with it
                print(f"mpi_train: {name} received; run recorded as {self.status}, stopping every rank.",
                      file=sys.stderr)
            # mpirun's SIGKILL follows within a second: no time to wait on the server
            self._report_spool(try_again=False)
        self.cluster.abort(128 + number)
