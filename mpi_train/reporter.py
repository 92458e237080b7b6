"""Every rank-0 side effect of a training job in one place: console lines, the summary file, the tracker.

Collectives happen on every rank in the training loop; the gathered values are then
handed to the reporter. On rank 0 it is a real `Reporter`; on the other ranks it is a
`SilentReporter` whose methods do nothing, so the loop never asks "am I rank 0?".

The paths it writes only at the end (the summary, the timeline) are checked before the
first step, with the checkpoint and spool folders, by `check_outputs`: a job that could
not keep what it trained for stops before it trains.

When the job was run directly (no launcher) with its output on a terminal, a live progress
bar (tqdm's) sits below the lines: the step, the epoch, the last logged loss and samples/s,
and the time left. Anywhere else the lines are all there is.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

from . import memory, swimlanes, timeline
from .advice.cache import described
from .config import JobInfo, TrainConfig
from .environments import ENVIRONMENTS
from .errors import folder_write_error
from .files import write_json_atomically
from .throughput import Throughput
from .tracking import NullTracker
from .tracking.names import GRADIENT_FIGURES, PHASES, SPLIT
from .tracking.spool import SPOOL_DIR
from .tracking.store import SERVER_SCHEMES


def write_error(path: Path, folder: bool) -> str | None:
    """Why `path` (a file, or a folder when `folder`) could not be written, as what follows its name, or None.
    Creates nothing, so that a job refused here leaves no empty folder behind: the nearest folder that exists must
    take a file."""
    try:
        if path.exists() and path.is_dir() != folder:
            return "is a folder, not a file" if path.is_dir() else "is a file, not a folder"
        nearest = path.absolute() if folder else path.absolute().parent
        while not nearest.exists() and nearest != nearest.parent:
            nearest = nearest.parent
        if not nearest.is_dir():
            return f"lies under {nearest}, which is a file"
    except OSError as error:
        return f"cannot be reached ({error.strerror or error})"
    reason = folder_write_error(nearest)
    return f"cannot be written: {nearest} takes no file ({reason})" if reason else None


def job_outputs(config: TrainConfig) -> list[tuple[str, Path, bool, str]]:
    """What rank 0 writes for this job, by the flag that names it: (flag, path, a folder?, the fix)."""
    outputs = []
    if config.summary_json:
        summary = Path(config.summary_json)
        outputs.append(("--summary-json", summary, False, f"name a file, e.g. --summary-json {summary / 'summary.json'}"
                        if summary.is_dir() else "name a file in a writable folder"))
    if config.timeline_window:
        outputs.append(("--timeline-dir", Path(config.timeline_dir), True,
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
        outcome = " ".join(problems) + " Nothing was trained." if problems else None
    cluster.agree(outcome, "The job cannot write its outputs")


# the live bar: "epoch 1  step 37/196 |####      | ETA 01:52, loss 2.0455, 95 samples/s" (tqdm puts the ", "
# before the postfix: the last logged step's loss and samples/s)
PROGRESS_FORMAT = "{desc}  step {n_fmt}/{total_fmt} |{bar}| ETA {remaining}{postfix}"


def progress_bar(job: JobInfo) -> tqdm | None:
    """The live progress bar on standard output for a job run directly on a terminal, else None: into a file or a
    pipe, and under any launcher, the output is read as lines. A launcher's rank may well print to a terminal, but
    it is the launcher's (Open MPI's mpirun gives each rank one even when its own output goes to a file), forwarded
    as lines."""
    if not sys.stdout.isatty() or any(environment.detect(os.environ) for environment in ENVIRONMENTS.values()):
        return None
    done = job.resumed_from["step"] if job.resumed_from else 0
    return tqdm(total=job.total_steps, initial=done, desc=f"epoch {done // max(job.steps_per_epoch, 1) + 1}",
                file=sys.stdout, bar_format=PROGRESS_FORMAT, dynamic_ncols=True)


def mean_over_ranks(per_rank: list[dict], key: str) -> float:
    return statistics.fmean(record[key] for record in per_rank)


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
    def log_step(self, epoch: int, step: int, total_steps: int, per_rank: list[dict],
                 lr: float | None = None) -> None: ...
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


def against_model(wire: dict[str, float], predicted: dict[str, float]) -> str:
    """Each collective's measured seconds on the wire beside the model's (Prediction.parts), for the console; a
    message named for where it runs ("allreduce (DDP bucket)") is its collective's."""
    def collective(message: str) -> str:
        return message if message in predicted else message.split(" (")[0]

    def beside(name: str, seconds: float) -> str:
        model = predicted.get(collective(name))
        return f"{name} {seconds * 1e3:.1f} ms" + (
            f" (model {model * 1e3:.1f} ms, {(model / seconds - 1) * 100:+.0f}%)" if model and seconds else "")
    unmatched = [f"{name} {seconds * 1e3:.1f} ms" for name, seconds in predicted.items()
                 if name not in {collective(message) for message in wire}]
    return ", ".join(beside(name, seconds) for name, seconds in wire.items()) + (
        f"; the model: {', '.join(unmatched)}" if unmatched else "")


class Reporter(SilentReporter):
    """Rank 0: prints progress, collects the summary written at the end, and forwards both to the tracker."""

    def __init__(self, config_dict: dict, global_batch: int, summary_path: str | None, print_fn=print,
                 tracker: NullTracker | None = None, sync_model=None, steady_from: int = 1, name: str = "job",
                 alignments: list | None = None, throughput: Throughput | None = None):
        self.config = config_dict
        self.global_batch = global_batch
        self.summary_path = summary_path
        self.tracker = tracker or NullTracker()
        self.sync_model = sync_model  # the alpha-beta model's view of this job (netmodel.JobModel), None on one host
        self._print = print_fn
        self.job: dict = {}  # the JobInfo's fields, as the summary carries them
        self.steps: list[dict] = []
        self.epochs: list[dict] = []
        self.stalls: list[dict] = []  # hosts that went silent and came back (liveness.Stall)
        self.steady_from, self.name = steady_from, name  # steps after `steady_from` count in the steady means
        self.alignments = alignments or []  # each rank's clock offset to rank 0's and its error bound (timeline.py)
        self.split_steps: list[list[dict]] = []  # each rank's split steps (timeline.split)
        self.timeline: dict = {}  # the recorded window's per-message figures beside the model's, for the summary
        self.evaluations: list[dict] = []  # every test evaluation with the time and bytes it took to get there
        self.throughput = throughput  # the model's FLOPs per sample and the device's peak: FLOP/s and MFU
        self.held: dict = {}  # memory per rank, measured (memory.py) beside the model's (netmodel/memory.py)
        self.recompiled: int | None = None  # under --compile: graphs compiled once training began
        self.bar: tqdm | None = None  # the live progress bar, on a terminal only (progress_bar)

    def print(self, line: str) -> None:
        """Console output, also kept by the tracker as the run's console log; above the progress bar, if one is
        drawn."""
        if self.bar is None:
            self._print(line)
        else:
            with tqdm.external_write_mode(file=sys.stdout):  # the bar is cleared, the line printed, the bar redrawn
                self._print(line)
        self.tracker.console(line)

    def advance(self, epoch: int, step: int) -> None:
        """Step `step` (of epoch `epoch`) is done: the progress bar, if one is drawn, moves on."""
        if self.bar is None:
            return
        self.bar.set_description_str(f"epoch {epoch}", refresh=False)
        self.bar.update(step - self.bar.n)

    def end_progress(self) -> None:
        """The training loop is over (or failed): the bar stays as it last was, and what follows starts on a line
        of its own."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def start(self, job: JobInfo) -> None:
        self.job = job.as_dict()
        hosts = sorted(set(job.hosts))
        self.print(
            f"mpi_train: {job.world_size} rank(s) on {len(hosts)} host(s) ({', '.join(hosts)}), "
            f"backend {job.backend}, sync {self.config['sync']}, {self.config['model']} on "
            f"{self.config['dataset']}, batch {self.global_batch} ({job.batch_size_per_rank} per rank"
            + (f", in {self.config['accumulate']} micro-batches" if self.config.get("accumulate", 1) > 1 else "")
            + "), "
            f"{job.threads} thread(s) per rank, {job.total_steps} steps, precision {job.precision}"
            + (f" (--precision {self.config['precision']})" if self.config.get("precision", job.precision)
               != job.precision else "")
            + f", rendezvous {job.rendezvous}"
            + (f", data {job.data_path}" if job.data_path else "")
        )
        if job.compile_s is not None:
            self.print(f"mpi_train: compiled (torch.compile, --compile-mode {self.config['compile_mode']}) in "
                       f"{job.compile_s:.1f}s at setup, every batch size the job trains and scores; no step's time "
                       f"holds it")
        if job.advice:  # --sync auto: what it took, from which advice, and why
            self.print(f"mpi_train: {described(job.advice)}")
        resumed = job.resumed_from
        if resumed:
            reshard = resumed.get("world_size", job.world_size) != job.world_size
            self.print(f"mpi_train: resuming from step {resumed['step']} ({resumed['checkpoint']})"
                       + (f", written by {resumed['world_size']} ranks: resharded onto {job.world_size} with the same "
                          f"global batch, compression state started afresh" if reshard else ""))
        where = self.tracker.where()
        if where:
            self.print(f"mpi_train: {where}")
        if len(self.alignments) > 1:
            offset = max(abs(a.offset_s) for a in self.alignments)
            worst = max(a.error_s for a in self.alignments)
            self.print(f"mpi_train: clocks aligned to rank 0's (ping-pong, as NTP does): offsets up to "
                       f"{offset * 1e3:.3f} ms, error at most {worst * 1e3:.3f} ms")
        model = self.sync_model
        if model and model.host_links:
            self.print("mpi_train: host links measured: " + ", ".join(
                f"{host} {rate / 1e6:,.1f} MB/s" for host, rate in model.host_links.items()))
        if model and model.straggler:
            cost = model.straggler_cost(0.0)  # no compute measured yet: as if nothing hid behind backward
            self.tracker.log_straggler(model.straggler)
            self.print(f"mpi_train: slow host: {model.straggler.describe()}; every rank waits for it, about "
                       f"+{cost:.3f} s of sync per step by the model")
        self.bar = progress_bar(job)

    def log_step(self, epoch: int, step: int, total_steps: int, per_rank: list[dict], lr: float | None = None) -> None:
        loss = mean_over_ranks(per_rank, "loss")
        times = {key: mean_over_ranks(per_rank, key) for key in PHASES}
        splits = timeline.split([record.pop("steps") for record in per_rank])
        if splits and splits[0]:  # each rank's wait for the last to arrive, apart from its transfer
            for record, steps in zip(per_rank, splits):
                record.update(timeline.means(steps))
            times.update({key: mean_over_ranks(per_rank, key) for key in SPLIT})
            times["slowest_rank"] = timeline.slowest(splits)
            self.split_steps = [kept + steps for kept, steps in zip(self.split_steps or [[] for _ in splits], splits)]
        if self.sync_model:
            times["predicted_sync_time_s"] = self.sync_model.sync_time(times["compute_time_s"])
        speed = self.speed(times)
        times.update(speed)
        if all("drift" in record for record in per_rank):  # model averaging: the ranks' distance from their average
            times["drift"] = mean_over_ranks(per_rank, "drift")
        for key in GRADIENT_FIGURES:  # --clip-grad-norm's norm, 16-mixed's loss scale and skipped steps
            if all(key in record for record in per_rank):
                times[key] = mean_over_ranks(per_rank, key)
        self.steps.append({"step": step, "epoch": epoch, "loss": loss, **({"lr": lr} if lr is not None else {}),
                           **times})
        self.tracker.log_step(epoch, step, loss, times, self.global_batch / times["step_time_s"], per_rank, lr=lr)
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f}, {self.global_batch / times['step_time_s']:.0f} samples/s",
                                     refresh=False)
        self.print(
            f"epoch {epoch} step {step:>5}/{total_steps}  loss {loss:.4f}  "
            + (f"lr {lr:.4g}  " if lr is not None else "")
            + f"step {times['step_time_s']:.3f}s "
            f"(compute {times['compute_time_s']:.3f}s, sync {times['sync_time_s']:.3f}s"
            + (f": wait {times['sync_wait_s']:.3f}s" if "sync_wait_s" in times else "") + ")  "
            f"{self.global_batch / times['step_time_s']:.0f} samples/s"
            + (f" ({self.throughput.describe(speed)})" if speed else "")
            + (f"  drift {times['drift']:.4g}" if "drift" in times else "")
            + (f"  grad norm {times['grad_norm']:.4g}" if "grad_norm" in times else "")
            + (f"  loss scale {times['grad_scale']:.0f}, {times['skipped_steps']:.0f} step(s) skipped"
               if "grad_scale" in times else "")
        )

    def speed(self, times: dict) -> dict:
        """Samples/s per rank, the data phase's share, FLOP/s per rank and MFU of a step's (or the run's) means."""
        if not self.throughput:
            return {}
        return self.throughput.figures(times, self.global_batch, self.job.get("world_size", 1))

    def compiled_after_setup(self, graphs: int) -> None:
        """Under --compile: the graphs compiled once training began, each for a shape or mode the setup's warm-up did
        not run, its compile time inside the step (or evaluation) that met it. The summary counts them."""
        self.recompiled = graphs
        if graphs:
            self.print(f"mpi_train: warning: {graphs} graph(s) compiled after setup: the steps or evaluations that "
                       f"met them hold their compile time (TORCH_LOGS=recompiles names why)")

    def note_stall(self, stall) -> None:
        """A host that went silent and came back; called from the heartbeat watch's thread."""
        self.stalls.append({"host": stall.host, "ranks": list(stall.ranks), "step": stall.step,
                            "seconds": stall.seconds})
        self.tracker.log_stall(stall)
        self.print(f"mpi_train: network stall: {stall.describe()}; it answers again and the job goes on.")

    def slow_host(self, means: dict) -> dict:
        """The straggler and what it cost each step, by the model given the measured compute; printed too."""
        model = self.sync_model
        cost = model.straggler_cost(means["compute_time_s"])
        without = model.sync_time(means["compute_time_s"], model.network.without_slow())
        self.print(f"mpi_train: slow host {model.straggler.host} cost about {cost:.3f} s per step (model: sync "
                   f"{without + cost:.3f} s with its link, {without:.3f} s without; "
                   f"measured sync {means['sync_time_s']:.3f} s)")
        return {**model.straggler.as_dict(), "cost_s": cost, "predicted_sync_without_s": without}

    @property
    def language_model(self) -> bool:
        """A model scored on held-out text: its test loss is a validation loss per byte, with a perplexity."""
        return bool(self.throughput and self.throughput.tokens_per_sample)

    def scored(self, test_loss: float, test_accuracy: float) -> str:
        if self.language_model:
            return (f"validation loss {test_loss:.4f}  perplexity {math.exp(min(test_loss, 50)):.2f}  next-byte "
                    f"accuracy {100 * test_accuracy:.2f}%")
        return f"test loss {test_loss:.4f}  accuracy {100 * test_accuracy:.2f}%"

    def log_epoch(self, epoch: int, step: int, test_loss: float, test_accuracy: float, epoch_time_s: float) -> None:
        self.epochs.append({"epoch": epoch, "test_loss": test_loss, "test_accuracy": test_accuracy,
                            "epoch_time_s": epoch_time_s,
                            **({"perplexity": math.exp(min(test_loss, 50))} if self.language_model else {})})
        self.tracker.log_epoch(epoch, step, test_loss, test_accuracy, epoch_time_s)
        self.print(f"epoch {epoch} {self.scored(test_loss, test_accuracy)}  ({epoch_time_s:.1f}s)")

    def log_eval(self, step: int, test_loss: float, test_accuracy: float, elapsed_s: float, sent_bytes: float,
                 epoch_end: bool = False) -> None:
        """A test evaluation with the wall time (evaluations left out) and the bytes it took to get there: time and
        bytes to accuracy. An epoch's end was printed by log_epoch already."""
        perplexity = math.exp(min(test_loss, 50)) if self.language_model else None
        self.evaluations.append({"step": step, "test_loss": test_loss, "test_accuracy": test_accuracy,
                                 "elapsed_s": elapsed_s, "sent_mb": sent_bytes / 1e6,
                                 **({"perplexity": perplexity} if perplexity is not None else {})})
        self.tracker.log_eval(step, test_loss, test_accuracy, elapsed_s, sent_bytes / 1e6, perplexity)
        if not epoch_end:
            self.print(f"step {step} {self.scored(test_loss, test_accuracy)}  after "
                       f"{elapsed_s:.1f}s of training and {sent_bytes / 1e6:,.1f} MB sent")

    def memory(self, per_rank: list[dict] | None, predicted) -> None:
        """Each rank's held bytes (memory.held_bytes, gathered) and the model's prediction (a MemoryPrediction), for
        the end line and the summary; the job's figure is the most any rank held."""
        most = memory.most(per_rank or [])
        self.held = {"per_rank": per_rank or [], "most": most, "predicted": predicted.as_dict()}

    def finish(self, per_rank_means: list[dict], wall_time_s: float, per_rank_steady: list[dict] | None = None,
               timing_warmup_steps: int = 0, recorder_busy_s: list[float] | None = None,
               weights_sha256: str | None = None) -> None:
        """The whole-job summary; `per_rank_steady` are the means leaving out the first `timing_warmup_steps`
        (the seed assignment's convention: warm-up iterations are not timed); `recorder_busy_s`, each rank's time
        in its step recorder (the split's and the timeline's own cost); `weights_sha256`, the final weights' hash
        (equal hashes: equal weights, bit for bit, e.g. a resumed job's and the uninterrupted one's)."""
        overall = {key: mean_over_ranks(per_rank_means, key) for key in PHASES}
        steady = {key: mean_over_ranks(per_rank_steady or per_rank_means, key) for key in PHASES}
        self.print(
            f"done in {wall_time_s:.1f}s: mean step {steady['step_time_s']:.3f}s leaving out the first "
            f"{timing_warmup_steps} step(s) ({overall['step_time_s']:.3f}s over all), sync "
            f"{steady['sync_time_s']:.3f}s ({100 * steady['sync_time_s'] / steady['step_time_s']:.1f}% of step)"
            + (f"; memory per rank (the most any held): {memory.describe(self.held['most'])}, "
               f"{memory.predicted(self.held['predicted'])}" if self.held.get("most") else "")
        )
        summary = {
            "config": self.config,
            **self.job,
            "steps": self.steps,
            "epochs": self.epochs,
            "evaluations": self.evaluations,
            "per_rank_mean_times": per_rank_means,
            "per_rank_mean_times_after_warmup": per_rank_steady or per_rank_means,
            "mean_times": overall,
            "timing_warmup_steps": timing_warmup_steps,
            "mean_times_after_warmup": steady,
            "final_loss": self.steps[-1]["loss"] if self.steps else None,
            **({"throughput": {**self.throughput.as_dict(), **self.speed(steady)}} if self.throughput else {}),
            **({"weights_sha256": weights_sha256} if weights_sha256 else {}),
            **({"memory": self.held} if self.held else {}),
            "network_stalls": self.stalls,
            **self.split_summary(steady),
            **({"recorder_busy_s": recorder_busy_s} if recorder_busy_s else {}),
            **({"timeline": self.timeline} if self.timeline else {}),
            "clock_alignment": [{"rank": rank, "offset_s": a.offset_s, "error_s": a.error_s}
                                for rank, a in enumerate(self.alignments)],
            **({"predicted_sync_time_s": self.sync_model.sync_time(steady["compute_time_s"]),
                "prediction_fit_error": self.sync_model.fit_error} if self.sync_model else {}),
            **({"slow_host": self.slow_host(steady)} if self.sync_model and self.sync_model.straggler else {}),
            **({"graphs_compiled_after_setup": self.recompiled} if self.recompiled is not None else {}),
            "wall_time_s": wall_time_s,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if self.summary_path:
            write_json_atomically(self.summary_path, summary)
        self.tracker.finish(summary)

    def split_summary(self, steady: dict) -> dict:
        """The wait for the last rank apart from transfer, over the steps after the warm-up (said and printed)."""
        if not self.split_steps:
            return {}
        after = [[s for s in steps if s["step"] > self.steady_from] for steps in self.split_steps]
        chosen = after if after[0] else self.split_steps  # a job too short to leave any out: all its steps
        per_rank = [timeline.means(steps) for steps in chosen]
        mean = {key: statistics.fmean(rank[key] for rank in per_rank) for key in SPLIT}
        slowest = timeline.slowest(chosen)
        self.print(f"mpi_train: sync split: wait for the last rank {mean['sync_wait_s']:.3f}s, transfer "
                   f"{mean['sync_transfer_s']:.3f}s, exposed communication {mean['exposed_comm_s']:.3f}s "
                   f"({100 * mean['comm_overlap']:.0f}% of message time during backward); the ranks waited most "
                   f"for rank {slowest}")
        return {"sync_split_after_warmup": {"mean": mean, "per_rank": per_rank, "slowest_rank": slowest}}

    def save_timeline(self, per_rank_events: list | None, alignments, recorder, method) -> None:
        """The job's trace (Chrome-trace JSON) and its swimlane picture under --timeline-dir, and in MLflow."""
        folder = Path(self.config["timeline_dir"])
        folder.mkdir(parents=True, exist_ok=True)
        about = {"run": self.name, "sync": self.config["sync"], "compression": self.config["compression"],
                 "steps": list(recorder.window)}
        document = timeline.trace(per_rank_events, self.job["hosts"], alignments, about)
        path = folder / f"{self.name}.trace.json"
        write_json_atomically(str(path), document)
        plan = self.predicted_plan(recorder, method)
        picture = swimlanes.draw(document, folder / f"{self.name}.swimlanes.png", plan)
        wire = {name: statistics.fmean(steps) for name, steps in
                timeline.wire_per_step(document["traceEvents"]).items()}
        predicted = self.sync_model.prediction.parts if self.sync_model else {}
        self.timeline = {"steps": [recorder.kept[0].step, recorder.kept[-1].step] if recorder.kept else [],
                         "trace": str(path), "messages": swimlanes.bucket_rows(recorder.kept, plan),
                         "wire_s_per_step": wire, **({"predicted_wire_s_per_step": predicted} if predicted else {})}
        self.print(f"mpi_train: timeline of steps {recorder.window[0]}.."
                   f"{min(recorder.window[1], self.job['total_steps'])}: {path} (open it in https://ui.perfetto.dev or "
                   f"chrome://tracing), {picture}")
        if wire:
            self.print("mpi_train: on the wire per step (the timeline's steps, each message from the last rank's "
                       f"launch): {against_model(wire, predicted)}")
        for written in (path, picture):
            self.tracker.log_artifact(written, "timeline")

    def predicted_plan(self, recorder, method) -> dict | None:
        """What the alpha-beta model expects of rank 0's first kept step's messages, from when that step's
        gradients were ready (seconds from its backward's start), for the swimlanes; None without a model."""
        model = self.sync_model
        if model is None or not recorder.kept:
            return None
        return swimlanes.predicted(recorder.kept[0], model, method)

    def save_weights(self, state: dict) -> None:
        """--save-model: the trained model, logged to MLflow as a model that loads (tracking/runs.py), and how."""
        uri = self.tracker.save_weights(state)
        if uri:
            self.print(f"mpi_train: trained model saved: mlflow.pytorch.load_model(\"{uri}\") loads it")
