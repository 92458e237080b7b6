"""Advice: which lossless sync method (and bucket size) to run on these hosts, and --sync auto that follows it.

    search.py   every lossless method, and every bucket size that cuts the gradients differently, predicted
                by the alpha-beta model; the shortlist the advisor measures; Kendall's tau of its ranking
    memory_limit.py  --memory-limit: sizes, and the candidates the model predicts fit in them
    cache.py    advice files under mlruns/advice/: the newest that fits a setting, its reused calibration,
                and what --sync auto takes from it

The advisor itself, a rank program launched like training, is commands/advise.py; its measuring is benchmark/.
"""

from .cache import Setting, resolve
from .search import Candidate, Predicted, StepModel

__all__ = ["Candidate", "Predicted", "Setting", "StepModel", "resolve"]
