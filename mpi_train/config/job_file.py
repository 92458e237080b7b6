"""Job files (--config FILE.toml): read, checked as the flags are, and written back from the job a run ran."""

from __future__ import annotations

import difflib
import json
import math
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

from ..errors import UserError
from .flags import field_choices, field_kinds
from .train_config import TrainConfig
from .validation import check_ranges

# A job file (--config FILE.toml) sets fields by name, one `key = value` a line (batch_size = 256), as an experiment
# file's [train] table does; option_error checks both, so they say the same. Each tracked run logs the job it ran as
# one (job_file), which reruns it: same seed, same losses. What the logged file leaves out, and why:
JOB_FILE_LEAVES_OUT = {
    "summary_json": "an output of the run's own, which a rerun would overwrite",
    "timeline_dir": "an output of the run's own, which a rerun would overwrite",
    "checkpoint_dir": "the run's checkpoints, which a rerun would resume from or overwrite",
    "checkpoint_every": "goes with checkpoint_dir",
    "resume": "a rerun starts afresh, which a resumed job equals (it continued as if never stopped)",
    "reshard": "goes with resume",
    "advice": "the file holds the flags --sync auto took from the advice, in its place",
    "tracking_uri": "where a rerun is recorded is the rerunner's to say (a URI may carry a password)",
    "master_addr": "the rendezvous address of the hosts this run had",
}
TOML_KINDS = {bool: ((bool,), "true or false"), int: ((int,), "an integer"), float: ((int, float), "a number"),
              str: ((str,), "a string")}


def shown(value) -> str:
    """A value of a file as a message names it: a string ('256')."""
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    return f"{kind.get(type(value), type(value).__name__)} ({value!r})" if not isinstance(value, dict) else "a table"


def option_error(name: str, value) -> str | None:
    """Why a file's `value` cannot set field `name` (not of its type, or not one of its choices), or None."""
    kind = field_kinds()[name]
    types, described = TOML_KINDS[kind]
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, types):
        return f"must be {described}, got {shown(value)}."
    choices = field_choices(name)
    if choices and value not in choices:
        close = difflib.get_close_matches(value, choices, n=1)
        return f"{value!r} is not one of {', '.join(choices)}." + (f" Did you mean {close[0]!r}?" if close else "")
    return None


def option_value(name: str, value):
    """A checked value as field `name` holds it: a whole number given for a float, as a float."""
    return float(value) if field_kinds()[name] is float else value


def read_toml(path: str | Path, named: str, fix: str) -> str:
    """A TOML file's text, UTF-8 as TOML is, less the byte-order mark Windows' editors put before it (which TOML's
    parser takes for a stray character); a UserError `cannot read the {named}: why. {fix}` when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        reason = "it is not UTF-8 text"
    except OSError as error:
        reason = error.strerror or str(error)
    raise UserError(f"cannot read the {named}: {reason}. {fix}")


def toml_mistake(error: tomllib.TOMLDecodeError) -> tuple[int | None, str]:
    """The line of a TOML syntax error, where the parser says it, and its message without the position."""
    line = getattr(error, "lineno", None)  # Python >= 3.14; before, only the message carries it
    found = re.search(r"at line (\d+)", str(error))
    return line or (int(found.group(1)) if found else None), re.sub(r"\s*\(at line \d+, column \d+\)", "", str(error))


def read_job_file(path: str) -> str:
    """A job file's text; a UserError says why it cannot be read."""
    return read_toml(path, f"job file {path} (--config)", "Give the path of a TOML file of training options, e.g. "
                                                          "the config.toml a tracked run logged.")


def parse_job_file(text: str, path: str) -> dict:
    """A job file's options by field name, each checked as its flag is; a UserError names the file, the line and the
    key of the first mistake."""
    try:
        options = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line, message = toml_mistake(error)
        raise UserError(f"{path}{f', line {line}' if line else ''}: this is not valid TOML: {message}. Write one "
                        f"option a line, key = value, strings in quotes (see https://toml.io).") from None
    for key, value in options.items():
        line = _key_line(text, key)
        where = f"{path}{f', line {line}' if line else ''}, key {key}"
        if key in ("experiment", "sweep") and isinstance(value, (dict, list)):  # an experiment file's tables
            raise UserError(f"{where}: [{key}] is an experiment file's table, and --config takes a job file (training "
                            f"options at its top level). Run an experiment file with python -m mpi_train experiment "
                            f"{path}.")
        if isinstance(value, dict):  # an experiment file's [train], or a table of the user's: no option is one
            raise UserError(f"{where}: [{key}] is a table, and a job file holds no tables: write its options at the "
                            f"top level, without the [{key}] line, by name with _ for - (batch_size = 256).")
        if key not in field_kinds():
            close = difflib.get_close_matches(key, list(field_kinds()), n=1)
            raise UserError(f"{where}: unknown key {key!r}.{f' Did you mean {close[0]!r}?' if close else ''} A job "
                            f"file sets the options python -m mpi_train train --help lists, by name with _ for - "
                            f"(batch_size = 256), at its top level, without [tables].")
        problem = option_error(key, value)
        if problem:
            raise UserError(f"{where}: {problem}")
    return {key: option_value(key, value) for key, value in options.items()}


def check_file_ranges(config: TrainConfig, from_file: dict, text: str, path: str) -> None:
    """A number out of range that the job file set (and no flag replaced) refused at its line, as a type is: the
    checks run on the whole config name the flag (--batch-size), which the user never typed."""
    try:
        check_ranges(config)
    except UserError as error:
        said = str(error)
        key = next((key for key in from_file if f"--{key.replace('_', '-')} " in said
                    and same_value(getattr(config, key, None), from_file[key])), None)
        if key is not None:
            line = _key_line(text, key)
            raise UserError(f"{path}{f', line {line}' if line else ''}, key {key}: {said}") from None


def same_value(value, other) -> bool:
    """Equal, NaN to NaN included (a flag did not replace the file's value)."""
    return value == other or (isinstance(value, float) and isinstance(other, float) and math.isnan(value)
                              and math.isnan(other))


def _key_line(text: str, key: str) -> int | None:
    """The line of `text` that sets top-level `key`, or opens it as a [table]: tomllib gives values, not lines."""
    name = "|".join(re.escape(spelt) for spelt in (key, f'"{key}"', f"'{key}'"))
    sets, opens = re.compile(rf"\s*(?:{name})\s*[=.]"), re.compile(rf"\s*\[\[?\s*(?:{name})\s*[\].]")
    top = True  # keys before the first [table] are the top level's
    for number, line in enumerate(text.splitlines(), start=1):
        if opens.match(line):
            return number
        top = top and not line.lstrip().startswith("[")
        if top and sets.match(line):
            return number
    return None


def toml_value(value) -> str:
    """`value` written as TOML: floats by repr, the shortest text that reads back to the same bits."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")  # a JSON string is a TOML basic one


def job_file(config: TrainConfig, world_size: int) -> str:
    """The job `config` describes as a job file: each option as the job ran it (the model and its optimizer's
    settings resolved, unset ones left out) but JOB_FILE_LEAVES_OUT. Run with --config on as many ranks, it computes
    the same job."""
    options = {key: value for key, value in config.as_dict().items()
               if key in field_kinds() and key not in JOB_FILE_LEAVES_OUT and value is not None}
    return (f"# The options of a job on {world_size} rank(s). Run it again with\n"
            f"#   mpirun -np {world_size} python -m mpi_train --config config.toml\n"
            f"# (a flag after it overrides its key; python -m mpi_train train --help says what each option does).\n"
            + "".join(f"{key} = {toml_value(value)}\n" for key, value in options.items()))

