"""What each key of an experiment file may hold, which of them a run reads, and the checks that name a mistake's file,
line and key.

experiment_file.py reads the file with these; its docstring lists the keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import TrainConfig, option_error, option_value, shown
from ..errors import UserError
from ..models import GPT_SIZES
from ..sync import method_option_names, reads_option
from .toml_lines import key_label, locate

SET_BY_SWEEP = ("sync", "seed", "experiment", "tracking_uri", "no_tracking", "run_name", "summary_json")  # the runner's
TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig) if f.name not in SET_BY_SWEEP}
NUMBER = (int, float)


@dataclass(frozen=True)
class Key:
    """What a key of a table may hold: `types` checks the value, `each` every item of a list."""

    types: tuple
    describe: str
    each: tuple | None = None


SECTIONS: dict[str, dict[str, Key]] = {
    "experiment": {
        "name": Key((str,), "a string"), "description": Key((str,), "a string"),
        "tracking": Key((bool,), "true or false"),
        "tracking_uri": Key((str,), "a string"), "out": Key((str,), "a string (a folder)"),
        "target_accuracy": Key(NUMBER, "a test accuracy as a fraction, e.g. 0.6 for 60%"),
        "target_loss": Key(NUMBER, "a validation loss, e.g. 2.0 (nats per byte for gpt)"),
    },
    "launch": {
        "hostfile": Key((str,), 'a string (a file, or "" for none)'),
        "mpirun_args": Key((list,), "a list of strings", each=(str,)),
        "timeout": Key(NUMBER, "a number of seconds"),
    },
    "network": {
        "hosts": Key((int, list), "an integer or a list of integers", each=(int,)),
        "ranks_per_host": Key((int, list), "an integer or a list of integers", each=(int,)),
        "link": Key((str, list), 'a rate like "1gbit", "unlimited", or a list of them', each=(str,)),
        "prefix": Key((str,), "a string (at most 10 letters and digits)"),
        "subnet": Key((str,), 'a string (the first three numbers of a /24 network, e.g. "10.80.0")'),
    },
    "bench": {
        "np": Key((int, list), "an integer (a list of them with [network])", each=(int,)),
        "steps": Key((int,), "an integer"),
        "warmup": Key((int,), "an integer"),
        "batch_size": Key((int,), "an integer"), "model": Key((str,), "a string"),
        "gpt_size": Key((str,), f"one of {', '.join(GPT_SIZES)}"),
        "methods": Key((list,), 'a list of method labels, e.g. ["ddp", "bucketed+powersgd"]', each=(str,)),
    },
}
SWEEP_KEYS = {
    "sync": Key((str, list), 'a method name, a list of them, or "all"', each=(str,)),
    "compression": Key((str, list), "a compression name or a list of them", each=(str,)),
    "np": Key((int, list), "an integer or a list of integers", each=(int,)),
    "seed": Key((int, list), "an integer or a list of integers", each=(int,)),
    "model": Key((str, list), "a model name or a list of them", each=(str,)),
    "env": Key((dict,), "a table of strings"),
}


class SweepError(UserError):
    """A mistake in an experiment file: says which file, line and key, and that nothing was launched."""

    def __init__(self, path: Path, line: int | None, key: str, message: str):
        where = f"{path}, line {line}" if line else f"{path}"
        super().__init__(f"{where}, key {key}: {message} Nothing was launched.")
        self.line, self.key = line, key


show = shown  # a value as a message names it, as a job file's messages do


class KeyChecker:
    """The checks every table shares, each raising a SweepError that names the key's line in the file's text."""

    def __init__(self, path: Path, text: str):
        self.path, self.text = path, text

    def fail(self, where: tuple, message: str, line_of: tuple | None = None) -> SweepError:
        return SweepError(self.path, locate(self.text, line_of or where), key_label(where), message)

    def check_keys(self, table: dict, allowed: typing.Iterable[str], where: tuple) -> None:
        allowed = list(dict.fromkeys(allowed))  # a grid's own keys and the training options share a few
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                set_here = f" It is set by the sweep itself ({', '.join(SET_BY_SWEEP)})." if key in SET_BY_SWEEP else ""
                raise self.fail(where + (key,), f"unknown key {key!r} in [{key_label(where)}].{set_here}{hint} "
                                f"Known keys: {', '.join(allowed)}.")

    def check_type(self, value: Any, spec: Key, where: tuple) -> Any:
        def fits(item, types) -> bool:
            if isinstance(item, bool):
                return bool in types
            return isinstance(item, types)

        if not fits(value, spec.types):
            raise self.fail(where, f"must be {spec.describe}, got {show(value)}.")
        if spec.each and isinstance(value, list):
            if not value:
                raise self.fail(where, f"must be {spec.describe}, got an empty list.")
            for item in value:
                if not fits(item, spec.each):
                    raise self.fail(where, f"must be {spec.describe}, but the list holds {show(item)}.")
        return value

    def check_once(self, values: list, where: tuple, same=lambda value: value) -> None:
        """A list whose values are runs (a grid's, the network's) names each once: a value given twice would run the
        same job twice under two names, or be dropped without a word."""
        seen = [same(value) for value in values]
        if twice := [value for i, value in enumerate(values) if seen[i] in seen[:i]]:
            raise self.fail(where, f"lists {twice[0]!r} twice, which would run the same job twice under two names. "
                                   f"Give each value once.")

    def check_train(self, table: dict, where: tuple) -> dict:
        """Options of `python -m mpi_train`, checked as a job file's (--config) are: the same types, choices and
        words."""
        for key, value in table.items():
            problem = option_error(key, value)
            if problem:
                raise self.fail(where + (key,), problem)
        return {key: option_value(key, value) for key, value in table.items()}


def options_it_reads(options: dict, pairs: list[tuple[str, str]]) -> dict:
    """A run's options less the methods' flags its method and compressor would ignore, where the grid sweeps several
    (method, compression) pairs and another of them reads the flag: `powersgd_rank = 4` over compression = ["none",
    "powersgd"] tunes the PowerSGD runs. A flag no pair reads stays, to be refused where it was written."""
    def ignored(name: str) -> bool:
        return (name in method_option_names() and options[name] not in (None, False)
                and not reads_option(options["sync"], options["compression"], name)
                and any(reads_option(*pair, name) for pair in pairs))

    return {key: value for key, value in options.items() if not ignored(key)} if len(pairs) > 1 else options
