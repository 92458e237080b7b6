"""Rank 0's outputs: the console, the summary file and the tracker, each behind `log(metrics, step)` and `close()`.

The reporter (reporter.py) measures what a step's gathered figures say once and hands the result, as `Metrics`, to
every output through one `Outputs`; each output keeps, prints or sends the kinds it shows.
"""

from .records import EPOCH, EPOCH_EVALUATION, EVALUATION, STALL, STEP, SUMMARY, Context, Metrics, Output, Outputs

__all__ = ["EPOCH", "EPOCH_EVALUATION", "EVALUATION", "STALL", "STEP", "SUMMARY", "Context", "Metrics", "Output",
           "Outputs"]
