"""The names and choices TrainConfig's fields offer, and the first of its option classes: which method syncs.

Apart from train_config.py so the checks (validation.py) and the flags (flags.py) can read them
without the class that composes them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..environments import LAUNCHERS  # the --launcher names, one per cluster environment
from ..models.user import is_path as is_users
from ..optimizers import OPTIMIZERS
from ..sync import COMPRESSORS, SYNC_METHODS
from ..sync.flag_fields import option

ENV_DEFAULTS = {"tracking_uri": "MLFLOW_TRACKING_URI"}  # field filled from the environment when its flag is absent
DATASET_DEFAULT_MODEL = {"cifar10": "vgg11", "mnist": "mnist_cnn", "text": "gpt", "synthetic": "mnist_cnn",
                         "imagefolder": "resnet18"}
USERS_DATASET_MODEL = "resnet18"  # the default model on a data set of the user's own (--dataset MODULE:FUNCTION)
# (channels, height, width) of each image data set; synthetic makes what the model takes, text is bytes
DATASET_SHAPES = {"cifar10": (3, 32, 32), "mnist": (1, 28, 28)}
TIMELINE_DIR = "timelines"  # where --timeline writes when --timeline-dir is not given
SYNTHETIC_SIZE = 4096  # --dataset synthetic's training samples when --synthetic-size is not given
BACKENDS = ("auto", "gloo", "nccl")
LOADERS = ("auto", "resident", "dataloader")  # the data paths (data/loaders.py)
RESUME_AUTO = "auto"  # --resume auto: the latest checkpoint under --checkpoint-dir, if any
SYNC_AUTO = "auto"  # --sync auto: the method an advice recommends (advice/cache.py), resolved before setup
STORE_DIR = "mlruns"  # the embedded MLflow store's folder (tracking/store.py), where the advice is kept too
ADVICE_DIR = f"{STORE_DIR}/advice"  # where python -m mpi_train advise keeps its advice and --sync auto looks for it


def default_store_uri() -> str:
    """The embedded store: SQLite under ./mlruns (MLflow 3 takes no folder of files)."""
    return f"sqlite:///{STORE_DIR}/mlflow.db"


def given_uri(flag: str | None) -> str | None:
    """The destination the user named, the flag over $MLFLOW_TRACKING_URI; None where neither names one (a replay
    then sends each spool where its job was writing)."""
    return flag or os.environ.get(ENV_DEFAULTS["tracking_uri"]) or None


def resolve_uri(flag: str | None) -> str:
    """Where runs are recorded, the one rule every command follows: the flag, else $MLFLOW_TRACKING_URI, else the
    embedded store. Here, not in tracking/, so the data layer can tell which folder the job writes its store to."""
    return given_uri(flag) or default_store_uri()


# a field's `choices` names one (--model: models/)
REGISTRIES = {"sync": SYNC_METHODS, "compression": COMPRESSORS, "optimizer": OPTIMIZERS}


class DatasetNames(tuple):
    """--dataset's choices: the data sets named here, and any MODULE:FUNCTION, a data set of the user's own."""

    def __contains__(self, name) -> bool:
        return super().__contains__(name) or (isinstance(name, str) and is_users(name))


@dataclass(frozen=True)
class SyncChoice:
    """--sync and the advice --sync auto follows: the first fields of TrainConfig, before the methods' options."""

    sync: str = option("allreduce", "gradient synchronisation method; auto: the one python -m mpi_train advise "
                       "recommends for this job's hosts, model, batch and world size (see --advice)", choices="sync",
                       also=(SYNC_AUTO,))
    advice: str | None = option(None, f"with --sync auto: the advice to follow, a JSON of python -m mpi_train advise "
                                f"or a folder of them (default: the newest for this job's setting under "
                                f"{ADVICE_DIR}/)", metavar="PATH")


__all__ = ["ADVICE_DIR", "BACKENDS", "DATASET_DEFAULT_MODEL", "DATASET_SHAPES", "ENV_DEFAULTS", "LAUNCHERS", "LOADERS",
           "REGISTRIES", "RESUME_AUTO", "SYNC_AUTO", "USERS_DATASET_MODEL", "DatasetNames", "SyncChoice"]
