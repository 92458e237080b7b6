"""The one training configuration, TrainConfig, and what reads and writes it: flags, job files, checks.

Precedence is written down once: CLI > file > environment > defaults. A flag given on the
command line overrides the job file's key (`--config FILE.toml`, read by `parse_job_file`),
which overrides the environment (`MLFLOW_TRACKING_URI` fills --tracking-uri, `MASTER_ADDR`
--master-addr, when neither names them), which overrides the defaults.
`commands/train.py` builds the argument parser from TrainConfig's fields, so a new option is
one new field: in train_config.py, or in the option class of the method that reads it
(sync/bucketed.py's BucketOptions, sync/averaging_options.py's AveragingOptions, ...). A field whose
`choices` names a registry (fields.REGISTRIES) offers that registry's keys (and the words its
`also` adds, like --sync auto).

- fields.py: the names and choices the fields offer, and SyncChoice (--sync, --advice);
- train_config.py: TrainConfig, composing the methods' option classes;
- validation.py: the checks a job passes before any work starts;
- flags.py: the fields as flags of a parser; job_file.py: as a TOML job file;
- job_info.py: what a job turned out to be once set up; model_shape.py: the model's shape a checkpoint keeps.
"""

from __future__ import annotations

from .fields import (
    ADVICE_DIR,
    BACKENDS,
    DATASET_DEFAULT_MODEL,
    DATASET_SHAPES,
    ENV_DEFAULTS,
    LAUNCHERS,
    LOADERS,
    REGISTRIES,
    RESUME_AUTO,
    STORE_DIR,
    SYNC_AUTO,
    USERS_DATASET_MODEL,
    DatasetNames,
    SyncChoice,
    default_store_uri,
    given_uri,
    resolve_uri,
)
from .flags import (
    MODEL_FLAGS,
    TOOL_DATASETS,
    add_config_arguments,
    add_model_arguments,
    field_choices,
    field_kinds,
    model_config,
    model_flag_words,
    model_flags,
)
from .job_file import (
    JOB_FILE_LEAVES_OUT,
    TOML_KINDS,
    job_file,
    option_error,
    option_value,
    parse_job_file,
    read_job_file,
    shown,
    toml_value,
)
from .job_info import JobInfo
from .train_config import TrainConfig, redact_uri
from .validation import check_timeout, ranks_advice, ranks_that_split

__all__ = [
    "ADVICE_DIR",
    "BACKENDS",
    "DATASET_DEFAULT_MODEL",
    "DATASET_SHAPES",
    "ENV_DEFAULTS",
    "JOB_FILE_LEAVES_OUT",
    "LAUNCHERS",
    "LOADERS",
    "MODEL_FLAGS",
    "REGISTRIES",
    "RESUME_AUTO",
    "STORE_DIR",
    "SYNC_AUTO",
    "TOML_KINDS",
    "TOOL_DATASETS",
    "USERS_DATASET_MODEL",
    "DatasetNames",
    "JobInfo",
    "SyncChoice",
    "TrainConfig",
    "add_config_arguments",
    "add_model_arguments",
    "check_timeout",
    "default_store_uri",
    "field_choices",
    "field_kinds",
    "given_uri",
    "job_file",
    "model_config",
    "model_flag_words",
    "model_flags",
    "option_error",
    "option_value",
    "parse_job_file",
    "ranks_advice",
    "ranks_that_split",
    "read_job_file",
    "redact_uri",
    "resolve_uri",
    "shown",
    "toml_value",
]
