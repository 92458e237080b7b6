"""Every rank-0 side effect of a training job in one place: console lines, the summary file, the tracker.

Collectives happen on every rank in the training loop; the gathered values are then
handed to the reporter. On rank 0 it is a real `Reporter`, which measures what they say once
and fans the result out to its outputs (outputs/: the console, the summary file, the tracker);
on the other ranks it is a `SilentReporter` whose methods do nothing, so the loop never asks
"am I rank 0?".

The paths it writes only at the end (the summary, the timeline) are checked before the
first step, with the checkpoint and spool folders, by `check_outputs`: a job that could
not keep what it trained for stops before it trains. It claims the checkpoint folder for
the job, so that a second job started on it is refused instead of mixing its checkpoints in.
"""

from __future__ import annotations

from pathlib import Path

from . import memory, timeline
from .config import JobInfo, TrainConfig
from .files import claim_folder, write_error
from .outputs import (
    EPOCH,
    EPOCH_EVALUATION,
    EVALUATION,
    STALL,
    STEP,
    SUMMARY,
    Context,
    Metrics,
    Outputs,
    timeline_files,
)
from .outputs.console import Console, perplexity
from .outputs.summary import Ending, SummaryFile, mean_over_ranks
from .outputs.tracked import Tracked
from .throughput import Throughput
from .tracking import NullTracker
from .tracking.names import GRADIENT_FIGURES, PHASES, SPLIT
from .tracking.spool import SPOOL_DIR
from .tracking.store import SERVER_SCHEMES

__all__ = ["PHASES", "Reporter", "SilentReporter", "check_outputs", "job_outputs", "write_error"]


def job_outputs(config: TrainConfig) -> list[tuple[str, Path, bool, str]]:
    """What rank 0 writes for this job, by the flag that names it: (flag, path, a folder?, the fix)."""
    outputs = []
    if config.summary_json:
        summary = Path(config.summary_json)
        outputs.append(("--summary-json", summary, False, f"name a file, e.g. --summary-json {summary / 'summary.json'}"
                        if summary.is_dir() else "name a file in a writable folder"))
    if config.timeline_window:
        outputs.append(("--timeline-dir", Path(config.timeline_folder), True,
                        "name a writable folder (created if missing)"))
    if config.checkpoint_dir:
        outputs.append(("--checkpoint-dir", Path(config.checkpoint_dir), True,
                        "name a writable folder (created if missing)"))
    if not config.no_tracking and (config.tracking_uri or "").split(":", 1)[0].lower() in SERVER_SCHEMES:
        fix = (f"start the job from a folder where {SPOOL_DIR} can be written (it keeps what the MLflow server "
               f"misses), or pass --no-tracking")
        outputs.append(("the tracking spool folder", SPOOL_DIR, True, fix))
    return outputs


def check_outputs(config: TrainConfig, cluster) -> None:
    """Collective: every file and folder the job writes (on rank 0) checked before the first step, so that a job
    which could not keep its summary, timeline, checkpoints or spool stops before it trains, on every rank."""
    outcome = None
    if cluster.info.is_main:
        problems = [f"{flag} {path} {reason}; {fix}." for flag, path, folder, fix in job_outputs(config)
                    if (reason := write_error(path, folder))]
        if not problems and config.checkpoint_dir and (holder := claim_folder(Path(config.checkpoint_dir))):
            problems.append(f"--checkpoint-dir {config.checkpoint_dir} is in use by another job ({holder}): two jobs "
                            f"writing one folder mix their checkpoints, and --resume auto would continue the other's. "
                            f"Give this job a --checkpoint-dir of its own, or start it once that job has ended.")
        outcome = " ".join(problems) + " Nothing was trained." if problems else None
    cluster.agree(outcome, "The job cannot write its outputs")


class SilentReporter:
    """What ranks other than 0 report: nothing."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace) -> bool:
        self.end_progress()
        return False

    def start(self, job: JobInfo) -> None: ...
    def advance(self, epoch: int, step: int) -> None: ...
    def end_progress(self) -> None: ...
    def log_step(self, epoch: int, step: int, per_rank: list[dict], lr: float | None = None) -> None: ...
    def log_epoch(self, epoch: int, step: int, test_loss: float, test_accuracy: float,
                  epoch_time_s: float) -> None: ...
    def log_eval(self, step: int, test_loss: float, test_accuracy: float, elapsed_s: float, sent_bytes: float,
                 epoch_end: bool = False) -> None: ...
    def finish(self, per_rank_means: list[dict], wall_time_s: float, per_rank_steady: list[dict] | None = None,
               timing_warmup_steps: int = 0, recorder_busy_s: list[float] | None = None,
               weights_sha256: str | None = None) -> None: ...
    def save_weights(self, state: dict) -> None: ...
    def memory(self, per_rank: list[dict] | None, predicted) -> None: ...
    def note_stall(self, stall) -> None: ...
    def compiled_after_setup(self, graphs: int) -> None: ...
    def save_timeline(self, per_rank_events: list | None, alignments, recorder, method) -> None: ...

    def unwritten(self) -> str | None:
        """Why files of the job's end could not be written (a disk that filled as it trained), in one paragraph;
        None when they all were."""
        return None


class Reporter(SilentReporter):
    """Rank 0: turns what the ranks gathered into records and hands each to the console, the summary file and the
    tracker, through one `Outputs`."""

    def __init__(self, config_dict: dict, samples_per_step: int, summary_path: str | None, print_fn=print,
                 tracker: NullTracker | None = None, sync_model=None, steady_from: int = 1, name: str = "job",
                 alignments: list | None = None, throughput: Throughput | None = None):
        self.context = Context(config=config_dict, samples_per_step=samples_per_step, throughput=throughput,
                               sync_model=sync_model, alignments=tuple(alignments or ()), steady_from=steady_from,
                               name=name)
        self.tracker = tracker or NullTracker()
        self.job: dict = {}  # the JobInfo's fields, as the summary carries them
        self.console = Console(self.context, print_fn, echo=self.tracker.console)
        self.summary = SummaryFile(self.context, summary_path)
        self.outputs = Outputs(self.console, self.summary, Tracked(self.tracker, samples_per_step))
        self.timeline_unwritten: str | None = None

    def print(self, line: str) -> None:
        self.console.print(line)

    def start(self, job: JobInfo) -> None:
        self.job = job.as_dict()
        model = self.context.sync_model
        if model and model.straggler:
            self.tracker.log_straggler(model.straggler)
        self.console.start(job, self.tracker.where())

    def advance(self, epoch: int, step: int) -> None:
        self.console.advance(epoch, step)

    def end_progress(self) -> None:
        """The training loop is over (or failed): the progress bar, if drawn, ends; lines still print."""
        self.outputs.close()

    def log_step(self, epoch: int, step: int, per_rank: list[dict], lr: float | None = None) -> None:
        """A step's figures, means over the ranks."""
        times = {key: mean_over_ranks(per_rank, key) for key in PHASES}
        splits = timeline.split([record.pop("steps") for record in per_rank])
        if splits and splits[0]:  # each rank's wait for the last to arrive, apart from its transfer
            for record, steps in zip(per_rank, splits):
                record.update(timeline.means(steps))
            times.update({key: mean_over_ranks(per_rank, key) for key in SPLIT})
            times["slowest_rank"] = timeline.slowest(splits)
        model = self.context.sync_model
        if model:
            times["predicted_sync_time_s"] = model.sync_time(times["compute_time_s"])
        times.update(self.context.speed(times, self.job.get("world_size", 1)))
        if all("drift" in record for record in per_rank):  # model averaging: the ranks' distance from their average
            times["drift"] = mean_over_ranks(per_rank, "drift")
        for key in GRADIENT_FIGURES:  # --clip-grad-norm's norm, 16-mixed's loss scale and skipped steps
            if all(key in record for record in per_rank):
                times[key] = mean_over_ranks(per_rank, key)
        row = {"step": step, "epoch": epoch, "loss": mean_over_ranks(per_rank, "loss"),
               **({"lr": lr} if lr is not None else {}), **times}
        self.outputs.log(Metrics(kind=STEP, values=row, per_rank=tuple(per_rank),
                                 splits=tuple(splits) if splits and splits[0] else ()), step)

    def compiled_after_setup(self, graphs: int) -> None:
        """Under --compile: the graphs compiled once training began, each for a shape or mode the setup's warm-up did
        not run, its compile time inside the step (or evaluation) that met it. The summary counts them."""
        self.summary.recompiled = graphs
        if graphs:
            self.print(f"mpi_train: warning: {graphs} graph(s) compiled after setup: the steps or evaluations that "
                       f"met them hold their compile time (TORCH_LOGS=recompiles names why)")

    def note_stall(self, stall) -> None:
        """A host that went silent and came back; called from the heartbeat watch's thread."""
        row = {"host": stall.host, "ranks": list(stall.ranks), "step": stall.step, "seconds": stall.seconds}
        self.outputs.log(Metrics(kind=STALL, values=row), stall.step)

    def log_epoch(self, epoch: int, step: int, test_loss: float, test_accuracy: float, epoch_time_s: float) -> None:
        row = {"epoch": epoch, "test_loss": test_loss, "test_accuracy": test_accuracy, "epoch_time_s": epoch_time_s,
               **({"perplexity": perplexity(test_loss)} if self.context.language_model else {})}
        self.outputs.log(Metrics(kind=EPOCH, values=row), step)

    def log_eval(self, step: int, test_loss: float, test_accuracy: float, elapsed_s: float, sent_bytes: float,
                 epoch_end: bool = False) -> None:
        """A test evaluation with the wall time (evaluations left out) and the bytes it took to get there: time and
        bytes to accuracy. An epoch's end was printed by log_epoch already."""
        row = {"step": step, "test_loss": test_loss, "test_accuracy": test_accuracy, "elapsed_s": elapsed_s,
               "sent_mb": sent_bytes / 1e6,
               **({"perplexity": perplexity(test_loss)} if self.context.language_model else {})}
        self.outputs.log(Metrics(kind=EPOCH_EVALUATION if epoch_end else EVALUATION, values=row), step)

    def memory(self, per_rank: list[dict] | None, predicted) -> None:
        """Each rank's held bytes (memory.held_bytes, gathered) and the model's prediction (a MemoryPrediction), for
        the end line and the summary; the job's figure is the most any rank held."""
        self.summary.held = {"per_rank": per_rank or [], "most": memory.most(per_rank or []),
                             "predicted": predicted.as_dict()}

    def finish(self, per_rank_means: list[dict], wall_time_s: float, per_rank_steady: list[dict] | None = None,
               timing_warmup_steps: int = 0, recorder_busy_s: list[float] | None = None,
               weights_sha256: str | None = None) -> None:
        """The whole-job summary, printed, written and sent (see summary.Ending for what each argument is)."""
        ending = Ending(per_rank_means=per_rank_means, wall_time_s=wall_time_s, per_rank_steady=per_rank_steady,
                        timing_warmup_steps=timing_warmup_steps, recorder_busy_s=recorder_busy_s,
                        weights_sha256=weights_sha256)
        summary = self.summary.build(self.job, ending)
        self.outputs.log(Metrics(kind=SUMMARY, values=summary), self.job.get("total_steps", 0))

    def save_timeline(self, per_rank_events: list | None, alignments, recorder, method) -> None:
        """The job's trace (Chrome-trace JSON) and its swimlane picture under --timeline-dir, and in MLflow."""
        config = self.context.config
        about = {"run": self.context.name, "sync": config["sync"], "compression": config["compression"],
                 "steps": list(recorder.window),
                 **({"overlap_lost_to_compile": self.job["overlap_lost_to_compile"]}
                    if self.job.get("overlap_lost_to_compile") else {})}
        try:
            saved = timeline_files.save(Path(config["timeline_dir"]), about, self.job, per_rank_events, alignments,
                                        recorder, method, self.context.sync_model)
        except OSError as error:  # the job's exit tells (unwritten); the summary and the runs still follow
            self.timeline_unwritten = (f"the timeline (--timeline-dir {config['timeline_dir']}: "
                                       f"{error.strerror or error})")
            return
        self.summary.timeline = saved.part
        for line in saved.lines:
            self.print(line)
        for written in saved.files:
            self.tracker.log_artifact(written, "timeline")

    def save_weights(self, state: dict) -> None:
        """--save-model: the trained model, logged to MLflow as a model that loads (tracking/runs.py), and how."""
        loading = self.tracker.save_weights(state)
        if loading:
            self.print(f"mpi_train: trained model saved: {loading} loads it")

    def unwritten(self) -> str | None:
        files = [text for text in (self.timeline_unwritten, self.summary.unwritten) if text]
        unrecorded = self.tracker.unrecorded()
        if not files and not unrecorded:
            return None
        if not files:
            return f"the job trained to its end and its console lines hold its figures, but {unrecorded}."
        return (f"the job trained to its end, and its console lines and MLflow run (unless --no-tracking) hold its "
                f"figures, but {' and '.join(files)} could not be written. Free space there, or name another place "
                f"for the next run{f'; and {unrecorded}' if unrecorded else ''}.")
