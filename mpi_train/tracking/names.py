"""What every metric is called in MLflow, and so which section of the UI's chart view it lands in.

The chart view groups metrics by the prefix before the first "/", one section per prefix, so the
prefixes are the questions a user asks of a comparison:

    learning/   is it learning?         loss, lr, test_loss, test_accuracy (at the step they were taken; a
                                        language model's test_loss is its validation loss in nats per byte, with
                                        its perplexity);
                                        drift (local SGD, DiLoCo: the ranks' distance from their average);
                                        grad_norm (--clip-grad-norm: the norm before clipping), grad_scale
                                        (16-mixed: the loss scale after the step), skipped_steps (16-mixed:
                                        steps skipped for an overflow so far); at logged steps, means over ranks
    time/       where does a step go?   per logged step, means over ranks: step_s, data_s, compute_s, sync_s,
                                        optimizer_s, predicted_sync_s, samples_per_s (the job's) and
                                        samples_per_s_per_rank, data_share (of the step), flops_per_s (per
                                        rank), mfu (on a known GPU); world_size (jobs that
                                        may restart on fewer ranks); elapsed_s at each test evaluation;
                                        compile_s (--compile: the setup's compile, in no step; once, at step 0)
    summary/    how did the run end?    one steady-state mean per phase (SUMMARY_RULE), final loss and accuracy,
                                        wall time, the tracking overhead, a slow host's cost; with a timeline,
                                        wire_s (its collectives' time on the wire per step) and predicted_wire_s
    rank/       how do the ranks differ? each rank's child run: its own loss and phase times
    memory/     what does a rank hold?  parameters_bytes, gradients_bytes, optimizer_bytes, total_bytes (and on
                                        CUDA cuda_peak_bytes), logged once: on each rank's child run its own, on
                                        the job's run the most any rank held and predicted_total_bytes (the model's)
    sync_cost/  what does a method cost? one child run of a bench per method label
    advice/     which method to run here? one child run of an advice per candidate: predicted and measured step
    network/    stalls of a host's link; sent_mb at each test evaluation (bytes to accuracy)
    system/     CPU, memory, network and disk per host (system/<host>/...)

No key carries a method's name: methods are runs, so one chart compares them all. The chart view
orders sections alphabetically, so the first a user sees is learning/.
"""

from __future__ import annotations

from collections.abc import Mapping

PHASES = ("data_time_s", "compute_time_s", "sync_time_s", "optimizer_time_s", "step_time_s")  # the summary's keys
# The sync split (timeline.py): waiting for the last rank, transfer, communication compute did not hide, its overlap.
SPLIT = ("sync_wait_s", "sync_transfer_s", "exposed_comm_s", "comm_overlap")
# What a step achieves (throughput.py): samples/s per rank, the data phase's share, FLOP/s per rank and MFU.
THROUGHPUT = ("samples_per_s_per_rank", "data_share", "flops_per_s", "mfu")


def leaf(name: str) -> str:
    """`sync_time_s` -> `sync_s`: a phase's name in a metric key (other names stay as they are)."""
    return name.replace("_time_s", "_s") if name in PHASES else name


LOSS, LR, TEST_LOSS, TEST_ACCURACY = "learning/loss", "learning/lr", "learning/test_loss", "learning/test_accuracy"
PERPLEXITY = "learning/perplexity"  # a language model's, at each evaluation: exp(validation loss)
SAMPLES_PER_S, PREDICTED_SYNC = "time/samples_per_s", "time/predicted_sync_s"
EPOCH_TIME = "time/epoch_s"
COMPILE_TIME = "time/compile_s"  # under --compile: the setup's warm-up that compiled the graphs (the slowest rank's)
WORLD_SIZE = "time/world_size"  # under --resume auto: the ranks of each attempt, from the step it resumed at
STALL = "network/stall_s"
DRIFT = "learning/drift"  # model averaging: each rank's L2 distance from the average at its last one (mean over ranks)
ELAPSED = "time/elapsed_s"  # at each test evaluation: the job's wall time training so far, evaluations left out
SENT_MB = "network/sent_mb"  # at each test evaluation: megabytes rank 0 has sent so far (netmodel.bytes_sent_per_sync)
# Per-rank figures of the gradient the optimizer applied (step/gradients.py), means over ranks at a logged step:
# its norm before clipping (none at a skipped step), the loss scale after the step and the steps skipped so far.
GRADIENT_FIGURES = ("grad_norm", "grad_scale", "skipped_steps")


def learning_key(name: str) -> str:
    """A learning figure at a logged step: `learning/grad_norm`."""
    return f"learning/{name}"


def step_key(phase: str) -> str:
    """A phase's mean over ranks at a logged step: `time/sync_s`."""
    return f"time/{leaf(phase)}"


def rank_key(name: str) -> str:
    """A rank's own figure at a logged step, on its child run: `rank/loss`, `rank/sync_s`."""
    return f"rank/{leaf(name)}"


def summary_key(name: str) -> str:
    """A whole-run figure: `summary/sync_s` (a phase's steady-state mean), `summary/final_loss`. Logged at step 0,
    once, so the chart view draws it as bars, one per run or method."""
    return f"summary/{leaf(name)}"


def rank_summary_key(phase: str) -> str:
    """A rank's own steady-state mean, on its child run: `rank/mean_sync_s`."""
    return f"rank/mean_{leaf(phase)}"


SUMMARY_RULE = ("summary/<phase> = the mean over ranks and over the steps after the first --timing-warmup-steps "
                "(the timing warm-up; the whole job's when it is too short to leave any out)")

JOB_NOTE = ("A training job: learning/ holds its loss and test accuracy, time/ each logged step's phases (means over "
            "ranks), summary/ how it ended, system/ its hosts; each rank's own figures are on its child run (rank/). "
            f"In summary/, {SUMMARY_RULE}.")


def memory_key(name: str) -> str:
    """Bytes a rank holds, logged once at step 0: `memory/optimizer_bytes` (memory.py's figures)."""
    return f"memory/{name}"


def bench_key(name: str) -> str:
    """A bench row's figure, the same key on every method's child run: `sync_cost/exposed_s`."""
    return f"sync_cost/{name}"


def advice_key(name: str) -> str:
    """An advice candidate's figure, the same key on every candidate's child run: `advice/measured_step_s`."""
    return f"advice/{name}"


# The names before these sections, as jobs of earlier versions logged them (their readers accept both).
OLD_NAMES = {
    LOSS: "loss", TEST_ACCURACY: "test_accuracy", PREDICTED_SYNC: "predicted_sync_time_s",
    summary_key("final_loss"): "final_loss", summary_key("slow_host_cost_s"): "slow_host_cost_s",
    summary_key("samples_per_s"): "steady_throughput_samples_per_s",
    **{summary_key(phase): f"steady_mean_{phase}" for phase in PHASES},
    **{rank_key(phase): phase for phase in PHASES}, rank_key("loss"): "loss",
}
WHOLE_RUN_NAMES = {summary_key("samples_per_s"): "mean_throughput_samples_per_s",
                   **{summary_key(phase): f"mean_{phase}" for phase in PHASES}}  # jobs older still: no warm-up rule


def read(metrics: Mapping[str, float], key: str) -> float | None:
    """A run's latest value of `key`, under its name today or the one it had before."""
    for name in (key, OLD_NAMES.get(key), WHOLE_RUN_NAMES.get(key)):
        if name is not None and name in metrics:
            return metrics[name]
    return None
