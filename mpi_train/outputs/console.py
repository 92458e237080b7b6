"""The console: rank 0's lines, and below them, on a terminal, a live progress bar.

When the job was run directly (no launcher) with its output on a terminal, a live progress
bar (tqdm's) sits below the lines: the step, the epoch, the last logged loss and samples/s,
and the time left. Anywhere else the lines are all there is.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable

from tqdm import tqdm

from .. import memory
from ..advice.cache import described
from ..config import RESUME_AUTO, JobInfo
from ..environments import ENVIRONMENTS
from ..errors import UserError
from ..liveness import Stall
from ..sync import SYNC_METHODS
from ..sync.traits import INSIDE_DDP
from .records import EPOCH, EVALUATION, STALL, STEP, SUMMARY, Context, Metrics

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


def untrained_line(names: tuple[str, ...], config: dict) -> str:
    """The model's parameters that no logit depends on, which no step trains, and what a method that runs torch's
    DistributedDataParallel does about them."""
    listed = ", ".join(names[:4]) + (f" and {len(names) - 4:,} more" if len(names) > 4 else "")
    sync = config["sync"]
    method = SYNC_METHODS.get(sync)
    looks = (f"; --sync {sync} runs DistributedDataParallel with find_unused_parameters, which walks the graph at "
             f"every step to find them" if method is not None and method.traits.sends == INSIDE_DDP else "")
    return (f"mpi_train: {len(names):,} parameter(s) of --model {config['model']} get no gradient ({listed}): no "
            f"logit depends on them, so they keep their first values{looks}.")


def output_lost(error: OSError) -> str:
    """Why the job stops when its standard output takes no more lines, after pointing it at nothing: what is still
    written (the abort's flush, Python's own at its end) must not fail again."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    cause = ("the program reading it ended, as `| head` does" if isinstance(error, BrokenPipeError) else
             error.strerror or str(error))
    return (f"its standard output takes no more lines ({cause}), so the job stops here rather than train unseen. "
            f"Send the output to a file (`> train.log`) or through `tee`, or let the reader read to the end.")


def perplexity(test_loss: float) -> float:
    return math.exp(min(test_loss, 50))


class Console:
    """Prints what each record says; `echo` takes every line too (the tracker's console log)."""

    def __init__(self, context: Context, print_fn=print, echo: Callable[[str], None] = lambda line: None):
        self.context = context
        self._print, self.echo = print_fn, echo
        self.total_steps = 0  # the job's, from start()
        self.bar: tqdm | None = None  # the live progress bar, on a terminal only (progress_bar)

    def print(self, line: str) -> None:
        """A line above the progress bar, if one is drawn."""
        try:
            if self.bar is None:
                self._print(line)
            else:
                with tqdm.external_write_mode(file=sys.stdout):  # the bar is cleared, the line printed, the bar redrawn
                    self._print(line)
        except OSError as error:  # the reader of a pipe ended (`| head`), or the file's disk is full
            raise UserError(output_lost(error), collective=False) from None
        self.echo(line)

    def start(self, job: JobInfo, where: str | None) -> None:
        """The job's opening lines: how it runs, what it resumes, where it is tracked, what the hosts' links are."""
        self.total_steps = job.total_steps
        self.print(self.job_line(job))
        for warning in job.warnings:
            self.print(f"mpi_train: warning: {warning}")
        if job.compile_s is not None:
            self.print(f"mpi_train: compiled (torch.compile, --compile-mode {self.context.config['compile_mode']}) "
                       f"in {job.compile_s:.1f}s at setup, every batch size the job trains and scores; no step's time "
                       f"holds it")
        if job.overlap_lost_to_compile:
            self.print(f"mpi_train: compiled, --sync {self.context.config['sync']} loses overlap: "
                       f"{job.overlap_lost_to_compile}")
        if job.untrained_parameters:
            self.print(untrained_line(job.untrained_parameters, self.context.config))
        if job.advice:  # --sync auto: what it took, from which advice, and why
            self.print(f"mpi_train: {described(job.advice)}")
        resumed = job.resumed_from
        if resumed:
            reshard = resumed.get("world_size", job.world_size) != job.world_size
            self.print(f"mpi_train: resuming from step {resumed['step']} ({resumed['checkpoint']})"
                       + (f", written by {resumed['world_size']} ranks: resharded onto {job.world_size} with the same "
                          f"global batch, compression state started afresh" if reshard else ""))
        elif self.context.config.get("resume") == RESUME_AUTO:  # a mistyped folder would otherwise pass unseen
            self.print(f"mpi_train: --resume auto found no checkpoint under {self.context.config['checkpoint_dir']}: "
                       f"the job starts at step 0")
        if where:
            self.print(f"mpi_train: {where}")
        self.network_lines()
        self.bar = progress_bar(job)

    def job_line(self, job: JobInfo) -> str:
        config, hosts = self.context.config, sorted(set(job.hosts))
        return (
            f"mpi_train: {job.world_size} rank(s) on {len(hosts)} host(s) ({', '.join(hosts)}), "
            f"backend {job.backend}, sync {config['sync']}, {config['model']} on "
            f"{config['dataset']}, batch {job.batch_size_per_rank * job.world_size} ({job.batch_size_per_rank} per rank"
            + (f", in {config['accumulate']} micro-batches" if config.get("accumulate", 1) > 1 else "")
            + "), "
            f"{job.threads} thread(s) per rank, {job.total_steps} steps, precision {job.precision}"
            + (f" (--precision {config['precision']})" if config.get("precision", job.precision)
               != job.precision else "")
            + f", rendezvous {job.rendezvous}"
            + (f", data {job.data_path}" if job.data_path else "")
        )

    def network_lines(self) -> None:
        """The ranks' clocks, the hosts' links and a slow host, as measured before the first step."""
        alignments, model = self.context.alignments, self.context.sync_model
        if len(alignments) > 1:
            offset = max(abs(a.offset_s) for a in alignments)
            worst = max(a.error_s for a in alignments)
            self.print(f"mpi_train: clocks aligned to rank 0's (ping-pong, as NTP does): offsets up to "
                       f"{offset * 1e3:.3f} ms, error at most {worst * 1e3:.3f} ms")
        if model and model.host_links:
            self.print("mpi_train: host links measured: " + ", ".join(
                f"{host} {rate / 1e6:,.1f} MB/s" for host, rate in model.host_links.items()))
        if model and model.straggler:
            cost = model.straggler_cost(0.0)  # no compute measured yet: as if nothing hid behind backward
            self.print(f"mpi_train: slow host: {model.straggler.describe()}; every rank waits for it, about "
                       f"+{cost:.3f} s of sync per step by the model")

    def advance(self, epoch: int, step: int) -> None:
        """Step `step` (of epoch `epoch`) is done: the progress bar, if one is drawn, moves on."""
        if self.bar is None:
            return
        self.bar.set_description_str(f"epoch {epoch}", refresh=False)
        self.bar.update(step - self.bar.n)

    def log(self, metrics: Metrics, step: int) -> None:
        values = metrics.values
        if metrics.kind == STEP:
            self.step_line(values, step)
        elif metrics.kind == EPOCH:
            self.print(f"epoch {values['epoch']} {self.scored(values)}  ({values['epoch_time_s']:.1f}s)")
        elif metrics.kind == EVALUATION:  # an epoch's end's (EPOCH_EVALUATION) is on the epoch's line
            self.print(f"step {step} {self.scored(values)}  after {values['elapsed_s']:.1f}s of training and "
                       f"{values['sent_mb']:,.1f} MB sent")
        elif metrics.kind == STALL:
            stall = Stall(values["host"], tuple(values["ranks"]), values["step"], values["seconds"])
            self.print(f"mpi_train: network stall: {stall.describe()}; it answers again and the job goes on.")
        elif metrics.kind == SUMMARY:
            self.summary_lines(values)

    def step_line(self, row: dict, step: int) -> None:
        samples_per_s = self.context.samples_per_step / row["step_time_s"]
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {row['loss']:.4f}, {samples_per_s:.0f} samples/s", refresh=False)
        self.print(
            f"epoch {row['epoch']} step {step:>5}/{self.total_steps}  loss {row['loss']:.4f}  "
            + (f"lr {row['lr']:.4g}  " if "lr" in row else "")
            + f"step {row['step_time_s']:.3f}s "
            f"(compute {row['compute_time_s']:.3f}s, sync {row['sync_time_s']:.3f}s"
            + (f": wait {row['sync_wait_s']:.3f}s" if "sync_wait_s" in row else "") + ")  "
            f"{samples_per_s:.0f} samples/s"
            + (f" ({self.context.throughput.describe(row)})" if self.context.throughput else "")
            + (f"  drift {row['drift']:.4g}" if "drift" in row else "")
            + (f"  grad norm {row['grad_norm']:.4g}" if "grad_norm" in row else "")
            + (f"  loss scale {row['grad_scale']:.0f}, {row['skipped_steps']:.0f} step(s) skipped"
               if "grad_scale" in row else "")
        )

    def scored(self, values: dict) -> str:
        test_loss, test_accuracy = values["test_loss"], values["test_accuracy"]
        if self.context.language_model:
            return (f"validation loss {test_loss:.4f}  perplexity {perplexity(test_loss):.2f}  next-byte "
                    f"accuracy {100 * test_accuracy:.2f}%")
        return f"test loss {test_loss:.4f}  accuracy {100 * test_accuracy:.2f}%"

    def summary_lines(self, summary: dict) -> None:
        """The job's end: its times and memory, then the wait for the last rank and a slow host's cost, if known."""
        overall, steady = summary["mean_times"], summary["mean_times_after_warmup"]
        held = summary.get("memory", {})
        self.print(
            f"done in {summary['wall_time_s']:.1f}s: mean step {steady['step_time_s']:.3f}s leaving out the first "
            f"{summary['timing_warmup_steps']} step(s) ({overall['step_time_s']:.3f}s over all), sync "
            f"{steady['sync_time_s']:.3f}s ({100 * steady['sync_time_s'] / steady['step_time_s']:.1f}% of step)"
            + (f"; memory per rank (the most any held): {memory.describe(held['most'])}, "
               f"{memory.predicted(held['predicted'])}" if held.get("most") else "")
        )
        if "sync_split_after_warmup" in summary:
            split = summary["sync_split_after_warmup"]
            mean = split["mean"]
            self.print(f"mpi_train: sync split: wait for the last rank {mean['sync_wait_s']:.3f}s, transfer "
                       f"{mean['sync_transfer_s']:.3f}s, exposed communication {mean['exposed_comm_s']:.3f}s "
                       f"({100 * mean['comm_overlap']:.0f}% of message time during backward); the ranks waited most "
                       f"for rank {split['slowest_rank']}")
        if "slow_host" in summary:
            slow = summary["slow_host"]
            cost, without = slow["cost_s"], slow["predicted_sync_without_s"]
            self.print(f"mpi_train: slow host {slow['host']} cost about {cost:.3f} s per step (model: sync "
                       f"{without + cost:.3f} s with its link, {without:.3f} s without; "
                       f"measured sync {steady['sync_time_s']:.3f} s)")

    def close(self) -> None:
        """The bar stays as it last was, and what follows starts on a line of its own."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
