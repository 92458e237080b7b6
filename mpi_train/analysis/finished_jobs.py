"""The finished jobs a comparison reads, from MLflow or from --summary-json files, each as one FinishedJob."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..stragglers import Straggler
from ..sync import label
from ..tracking import job_metrics
from ..tracking import names as metric_names
from .noise import spread
from .time_to_accuracy import Evaluation


@dataclass
class FinishedJob:
    """One finished job as the comparison sees it."""

    run_id: str
    name: str
    sync: str
    world_size: int
    metrics: dict
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    rank_step_times: list[list[float]] = field(default_factory=list)  # per rank, every logged window
    params: dict = field(default_factory=dict)  # the parent run's params (link, num_hosts, ranks_per_host, ...)
    slow_host: str | None = None  # a straggler host found at its start (stragglers.Straggler.describe)
    evaluations: list[Evaluation] = field(default_factory=list)  # each test evaluation, for time to accuracy
    drift_curve: list[tuple[int, float]] = field(default_factory=list)  # local SGD, DiLoCo: ranks from their average
    step_times: list[float] = field(default_factory=list)  # logged step times after the warm-up (steady_step_times)

    @property
    def label(self) -> str:
        return f"{self.sync} np{self.world_size}"

    @property
    def workload(self) -> str:
        return f"{self.params.get('model', '?')} on {self.params.get('dataset', '?')}"

    @property
    def step_spread_s(self) -> float | None:
        """How far its step time strays on this machine: the standard deviation of its steady logged step times."""
        return spread(self.step_times)


def steady_step_times(windows: Sequence[tuple[int, float]], warmup_steps: int) -> list[float]:
    """A job's logged step times, (step, seconds) per window (each a mean over ranks), of the windows that start
    after the timing warm-up: a window holding a warm-up step is slower by its start-up, not by the machine's noise."""
    windows = sorted(windows)
    starts = [0, *(step for step, _ in windows[:-1])]  # a window starts after the step logged before it
    return [seconds for (_, seconds), before in zip(windows, starts) if before >= warmup_steps]


def load_jobs(client, experiment_id: str, since_ms: int | None = None, names: set | None = None) -> list[FinishedJob]:
    """Every FINISHED job (parent run) of the experiment with its loss curve and its ranks' step times.

    `since_ms` and `names` narrow it to the jobs of one sweep (started after it began, with its run names).
    """
    where = "tags.`mpi_train.role` = 'job' and attributes.status = 'FINISHED'"
    if since_ms is not None:
        where += f" and attributes.start_time >= {int(since_ms)}"
    parents = client.search_runs([experiment_id], filter_string=where, order_by=["attributes.start_time ASC"],
                                 max_results=1000)
    jobs = []
    for run in parents:
        if names is not None and run.info.run_name not in names:
            continue
        params, metrics = run.data.params, run.data.metrics
        # bucketed+powersgd apart from bucketed
        sync = label(params.get("sync", "?"), params.get("compression", "none"))
        job = FinishedJob(run_id=run.info.run_id, name=run.info.run_name, sync=sync,
                          world_size=int(params.get("world_size", 0)), metrics=metrics, params=dict(params),
                          slow_host=run.data.tags.get("mpi_train.slow_host_link"))
        job.loss_curve = [(m.step, m.value) for m in sorted(history(client, job.run_id, metric_names.LOSS),
                                                           key=lambda m: m.step)]
        # the job's ranks: a run the user nested under it with MLflow of their own is no rank
        children = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{job.run_id}' "
                                      f"and tags.`mpi_train.role` = 'rank'", max_results=1000)
        job.evaluations = evaluations(client, job.run_id)
        job.drift_curve = [(m.step, m.value) for m in sorted(history(client, job.run_id, metric_names.DRIFT),
                                                             key=lambda m: m.step)]
        job.step_times = steady_step_times(
            [(m.step, m.value) for m in history(client, job.run_id, metric_names.step_key("step_time_s"))],
            int(params.get("timing_warmup_steps", 1)))
        for child in sorted(children, key=lambda c: int(c.data.tags.get("rank", 0))):
            steps = history(client, child.info.run_id, metric_names.rank_key("step_time_s"))
            job.rank_step_times.append([m.value for m in steps])
        jobs.append(job)
    return distinct_names(sorted(jobs, key=lambda j: (j.sync, j.world_size, j.name)))


def distinct_names(jobs: list[FinishedJob]) -> list[FinishedJob]:
    """The jobs, those that share a run name (one --run-name given to two workloads, or a rerun) told apart in the
    tables and plots: by their workload where it differs, else by the start of their run id."""
    for tell in (lambda job: job.workload, lambda job: job.run_id[:8]):
        named: dict[str, list[FinishedJob]] = {}
        for job in jobs:
            named.setdefault(job.name, []).append(job)
        for same in named.values():
            if len(same) > 1 and len({tell(job) for job in same}) > 1:
                for job in same:
                    job.name = f"{job.name} [{tell(job)}]"
    return jobs


def history(client, run_id: str, key: str) -> list:
    """A metric's history under its name today, else under the name earlier versions logged it as."""
    found = client.get_metric_history(run_id, key)
    old = metric_names.OLD_NAMES.get(key)
    return found if found or old is None else client.get_metric_history(run_id, old)


def evaluations(client, run_id: str) -> list[Evaluation]:
    """A run's test evaluations with the training time and bytes logged at the same steps (jobs before these were
    logged: accuracy alone)."""
    at = {key: {m.step: m.value for m in history(client, run_id, key)}
          for key in (metric_names.TEST_ACCURACY, metric_names.ELAPSED, metric_names.SENT_MB, metric_names.TEST_LOSS)}
    return [Evaluation(step=step, accuracy=accuracy, elapsed_s=at[metric_names.ELAPSED].get(step),
                       sent_mb=at[metric_names.SENT_MB].get(step), loss=at[metric_names.TEST_LOSS].get(step))
            for step, accuracy in sorted(at[metric_names.TEST_ACCURACY].items())]


def job_from_summary(name: str, summary: dict) -> FinishedJob:
    """A job read from its --summary-json file instead of MLflow (runs made with --no-tracking)."""
    config = summary["config"]
    params = {"model": config.get("model"), "dataset": config.get("dataset"), "link": config.get("link"),
              "num_hosts": summary.get("num_hosts"),
              "ranks_per_host": summary.get("ranks_per_host"),
              **{key: str(config[key]) for key in ("period", "host_period", "powersgd_rank", "batch_size")
                 if config.get(key) is not None}}
    evaluated = [Evaluation(step=e["step"], accuracy=e["test_accuracy"], elapsed_s=e.get("elapsed_s"),
                            sent_mb=e.get("sent_mb"), loss=e.get("test_loss")) for e in summary.get("evaluations", [])]
    return FinishedJob(run_id="", name=name, sync=label(config["sync"], config.get("compression", "none")),
                       world_size=summary["world_size"], metrics=job_metrics(summary, config["batch_size"]),
                       loss_curve=[(step["step"], step["loss"]) for step in summary["steps"]],
                       rank_step_times=[[rank["step_time_s"]] for rank in summary["per_rank_mean_times"]],
                       params=params,
                       slow_host=Straggler.from_dict(summary["slow_host"]).describe() if summary.get("slow_host")
                       else None,
                       evaluations=evaluated,
                       drift_curve=[(step["step"], step["drift"]) for step in summary["steps"] if "drift" in step],
                       step_times=summary_step_times(summary))


def summary_step_times(summary: dict) -> list[float]:
    """steady_step_times of a job's --summary-json file."""
    return steady_step_times([(step["step"], step["step_time_s"]) for step in summary.get("steps", [])
                              if "step_time_s" in step], summary.get("timing_warmup_steps", 1))


def timing(metrics: dict, phase: str) -> float | None:
    """A job's mean `phase` time per step by SUMMARY_RULE (older jobs: whole-run means, if that is all they have)."""
    return metric_names.read(metrics, metric_names.summary_key(phase))


def throughput(metrics: dict) -> float | None:
    return metric_names.read(metrics, metric_names.summary_key("samples_per_s"))
