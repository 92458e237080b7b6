"""Experiment files: a TOML sweep (sync methods × world sizes × seeds) read into a checked list of planned runs.

    [experiment]                      # required: name = the MLflow experiment every run is filed under
    name = "compare_sync"
    tracking_uri = "http://127.0.0.1:5000"   # optional (default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db)
    tracking = true                   # false: --no-tracking for every run; the report then reads the runs' summaries
    out = "results/compare_sync"      # report, plots, logs and summaries (default: results/<name>)
    target_accuracy = 0.6             # the report's time to accuracy (default: best final accuracy - 2 points)
    # target_loss = 2.0               # or, not both: time to this validation loss (nats per byte for gpt; the
                                      # default for language models: best final validation loss + 0.05)

    [launch]                          # how mpirun is called
    hostfile = "hostfile"             # "" for none
    mpirun_args = ["--bind-to", "none"]
    timeout = 7200                    # seconds one run may take before it is stopped and counted as failed

    [train]                           # any `python -m mpi_train` option, for every run (flag names with _)
    dataset = "cifar10"
    batch_size = 256

    [[sweep]]                         # one or more grids; the runs are their union, in file order
    sync = "all"                      # a method, a list of them, or "all" (every registered method)
    np = [2, 4]                       # world sizes
    seed = [1, 2]                     # default: 42
    model = ["vgg11", "resnet18"]     # optional: a model or a list of them (runs named ...-MODEL)
    epochs = 2                        # any [train] option, for this grid only
    env = { GLOO_SOCKET_IFNAME = "eth0" }   # extra environment of these runs

    [bench]                           # optional: also run `python -m mpi_train bench` once, for the cost table
    np = 4
    steps = 20
    model = "gpt"                     # any model training takes (default: vgg11); gpt_size = "small" its size

    [network]                         # optional: hosts and links as sweep dimensions (test hosts, as root)
    hosts = [1, 2, 4]                 # 1: plain loopback (the [launch] hostfile); more: scripts/testhosts.sh hosts
    ranks_per_host = [1, 2]           # slots per host (or one number); a sweep without np runs hosts × ranks_per_host
    link = ["1gbit", "100mbit"]       # tc rate of every host's link, or "unlimited" (default)
    prefix = "mpilab"                 # test hosts' names and /24 network (default: mpilab, 10.80.0)
    subnet = "10.80.0"

With [network] every grid is crossed with each setting (hosts × ranks per host × link; one
host is loopback, unshaped); a world size is planned on a setting only if it fills its
hosts (more than (hosts - 1) × ranks_per_host ranks, at most hosts × ranks_per_host), and
[bench] runs once per setting, before its runs: on every setting, or on those of the world
sizes its `np` names. With [bench] and [network] the [[sweep]] tables may be left out: the
lab then measures each setting with the benchmark alone.

Every mistake is reported with the file, line and key, before anything is launched.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

from ..config import TrainConfig, option_error, option_value, shown
from ..errors import UserError
from ..models import GPT_SIZES, resolve
from ..netmodel.links import rate_bytes_per_s
from ..sync import COMPRESSORS, SYNC_METHODS, backend_error, combination_error, label, parse_labels
from .network import NetworkPlan, NetworkSetting

ALL_METHODS = "all"
SET_BY_SWEEP = ("sync", "seed", "experiment", "tracking_uri", "no_tracking", "run_name", "summary_json")  # the runner's
DEFAULT_SEED = 42
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


@dataclass(frozen=True)
class PlannedRun:
    """One mpirun launch of the sweep."""

    index: int  # 1-based position in the sweep
    name: str  # SYNC-npN-seedS, unique within the sweep: its MLflow run name and file names
    np: int
    config: TrainConfig  # every training option of the run; tracking fields are filled in by the runner
    env: dict = field(default_factory=dict)
    network: NetworkSetting | None = None  # with a [network] table: the hosts and link it runs on


@dataclass(frozen=True)
class BenchPlan:
    np: int  # its world size without [network]; with it, each setting's own
    steps: int = 20
    warmup: int = 2
    batch_size: int = 256
    model: str = "vgg11"
    gpt_size: str | None = None  # --model gpt's size (default: tiny)
    methods: tuple[str, ...] | None = None  # labels for the bench's --methods (default: every method and compression)
    settings: tuple[NetworkSetting, ...] | None = None  # with [network]: where it runs (default: every setting)


@dataclass(frozen=True)
class Sweep:
    """An experiment file, checked: where its results go and the runs it asks for."""

    path: Path
    name: str
    description: str
    tracking: bool
    tracking_uri: str | None
    out: Path
    hostfile: str | None
    mpirun_args: tuple[str, ...]
    timeout: float | None
    runs: tuple[PlannedRun, ...]
    bench: BenchPlan | None
    unavailable: tuple[tuple[str, str], ...] = ()  # (method label, why) left out of a sync = "all" grid
    network: NetworkPlan | None = None
    target_accuracy: float | None = None  # the report's time to accuracy (None: the best final accuracy - 2 points)
    target_loss: float | None = None  # or time to this validation loss (None: language models race to the best
    # final validation loss + 0.05 nats, others to the accuracy above)


class SweepError(UserError):
    """A mistake in an experiment file: says which file, line and key, and that nothing was launched."""

    def __init__(self, path: Path, line: int | None, key: str, message: str):
        where = f"{path}, line {line}" if line else f"{path}"
        super().__init__(f"{where}, key {key}: {message} Nothing was launched.")
        self.line, self.key = line, key


# ---------------------------------------------------------------------------------------------
# Finding a key's line: tomllib gives values only, so the text is scanned for the key in its table.

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*((?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)(?:\s*\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+))*)\s*=""")


def _parts(dotted: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in re.findall(r"""\s*("[^"]*"|'[^']*'|[^.]+)\s*""", dotted))


def locate(text: str, path: tuple) -> int | None:
    """The 1-based line where `path` (e.g. ("sweep", 1, "sync") or ("train", "batch_size")) is set, else where
    its nearest enclosing key or table is (a key inside an inline table, a required key that is missing)."""
    for end in range(len(path), 0, -1):
        line = _line_of(text, path[:end])
        if line:
            return line
    return None


def _line_of(text: str, path: tuple) -> int | None:
    current: tuple = ()
    seen: dict[tuple, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            names = _parts(header.group(2))
            resolved: tuple = ()
            for name in names[:-1]:  # a sub-table of an array table belongs to its latest element
                resolved += (name,)
                if resolved in seen:
                    resolved += (seen[resolved] - 1,)
            resolved += (names[-1],)
            if header.group(1) == "[[":
                seen[resolved] = seen.get(resolved, 0) + 1
                resolved += (seen[resolved] - 1,)
            current = resolved
            if current == path:
                return number
            continue
        key = _KEY.match(line)
        if key and current + _parts(key.group(1)) == path:
            return number
    return None


def _label(path: tuple) -> str:
    """sweep[2].sync for ("sweep", 1, "sync"): what the user calls the key (1-based tables)."""
    label = ""
    for part in path:
        label += f"[{part + 1}]" if isinstance(part, int) else (f".{part}" if label else part)
    return label


# ---------------------------------------------------------------------------------------------

class _Reader:
    def __init__(self, path: Path, text: str):
        self.path, self.text = path, text

    def fail(self, where: tuple, message: str, line_of: tuple | None = None) -> SweepError:
        return SweepError(self.path, locate(self.text, line_of or where), _label(where), message)

    def check_keys(self, table: dict, allowed: typing.Iterable[str], where: tuple) -> None:
        allowed = list(allowed)
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                set_here = f" It is set by the sweep itself ({', '.join(SET_BY_SWEEP)})." if key in SET_BY_SWEEP else ""
                raise self.fail(where + (key,), f"unknown key {key!r} in [{_label(where)}].{set_here}{hint} "
                                f"Known keys: {', '.join(allowed)}.")

    def check_type(self, value: Any, spec: Key, where: tuple) -> Any:
        def fits(item, types) -> bool:
            if isinstance(item, bool):
                return bool in types
            return isinstance(item, types)

        if not fits(value, spec.types):
            raise self.fail(where, f"must be {spec.describe}, got {_show(value)}.")
        if spec.each and isinstance(value, list):
            if not value:
                raise self.fail(where, f"must be {spec.describe}, got an empty list.")
            for item in value:
                if not fits(item, spec.each):
                    raise self.fail(where, f"must be {spec.describe}, but the list holds {_show(item)}.")
        return value

    def check_train(self, table: dict, where: tuple) -> dict:
        """Options of `python -m mpi_train`, checked as a job file's (--config) are: the same types, choices and
        words."""
        for key, value in table.items():
            problem = option_error(key, value)
            if problem:
                raise self.fail(where + (key,), problem)
        return {key: option_value(key, value) for key, value in table.items()}


_show = shown  # a value as a message names it, as a job file's messages do


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def parse(text: str, path: Path) -> Sweep:
    """Check an experiment file's text; raises SweepError (file, line, key) on the first mistake."""
    path = Path(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line = getattr(error, "lineno", None)  # Python ≥ 3.14; before, only the message carries it
        if line is None:
            found = re.search(r"at line (\d+)", str(error))
            line = int(found.group(1)) if found else None
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(error))
        raise SweepError(path, line, "(syntax)", f"this is not valid TOML: {message}. See https://toml.io for the "
                         f"syntax (strings in quotes, lists in [ ], one key = value per line).") from None
    reader = _Reader(path, text)
    reader.check_keys(data, [*SECTIONS, "train", "sweep"], ())
    for section in (*SECTIONS, "train"):
        if section in data and not isinstance(data[section], dict):
            raise reader.fail((section,), f"must be a table ([{section}]), got {_show(data[section])}.")
    for section, keys in SECTIONS.items():
        table = data.get(section, {})
        reader.check_keys(table, keys, (section,))
        for key, value in table.items():
            reader.check_type(value, keys[key], (section, key))

    network = _network(reader, data["network"]) if "network" in data else None
    settings = network.settings if network else (None,)
    experiment = data.get("experiment", {})
    if "name" not in experiment or not experiment["name"].strip():
        raise reader.fail(("experiment", "name"), "is required: the MLflow experiment every run is filed under, "
                          'e.g. [experiment] name = "compare_sync".', line_of=("experiment",))
    train = data.get("train", {})
    reader.check_keys(train, TRAIN_FIELDS, ("train",))
    train = reader.check_train(train, ("train",))

    sweeps = data.get("sweep", [] if network and "bench" in data else None)  # a lab may measure with the bench alone
    if not isinstance(sweeps, list) or (not sweeps and "sweep" in data):
        raise reader.fail(("sweep",), "at least one [[sweep]] table is needed, e.g. [[sweep]] sync = \"all\" np = [4] "
                          "(or, with [network], a [bench] table alone).")
    runs: list[PlannedRun] = []
    unavailable: list[tuple[str, str]] = []
    for number, grid in enumerate(sweeps):
        where = ("sweep", number)
        reader.check_keys(grid, [*SWEEP_KEYS, *TRAIN_FIELDS], where)
        if "sync" not in grid or ("np" not in grid and network is None):
            missing = "sync" if "sync" not in grid else "np"
            raise reader.fail(where + (missing,), "is required in every [[sweep]] (the grid is sync × np × seed).",
                              line_of=where)
        for key, expected in SWEEP_KEYS.items():
            if key in grid:
                reader.check_type(grid[key], expected, where + (key,))
        env = grid.get("env", {})
        for variable, value in env.items():
            if not isinstance(value, str):
                raise reader.fail(where + ("env", variable), f"must be a string, got {_show(value)}.")
        methods = list(SYNC_METHODS) if grid["sync"] == ALL_METHODS else _as_list(grid["sync"])
        for method in methods:
            if method not in SYNC_METHODS:
                close = difflib.get_close_matches(method, list(SYNC_METHODS), n=1)
                raise reader.fail(where + ("sync",), f"unknown sync method {method!r}."
                                  f"{f' Did you mean {close[0]!r}?' if close else ''} Registered methods: "
                                  f"{', '.join(SYNC_METHODS)} (or \"{ALL_METHODS}\" for every one).")
        for np in _as_list(grid.get("np", [])):
            if np < 1:
                raise reader.fail(where + ("np",), f"world sizes must be at least 1, got {np}.")
        compressions = _as_list(grid.get("compression", train.get("compression", "none")))
        for compression in compressions:
            if compression not in COMPRESSORS:
                raise reader.fail(where + ("compression",), f"unknown compression {compression!r}; choose from "
                                  f"{', '.join(COMPRESSORS)}.")
        models = _as_list(grid.get("model", train.get("model")))
        for model in models:
            if model is not None:
                try:
                    resolve(model)
                except UserError as error:
                    raise reader.fail(where + ("model",) if "model" in grid else ("train", "model"),
                                      str(error).replace("--model ", "model ", 1)) from None
        overrides = reader.check_train({k: v for k, v in grid.items()
                                        if k in TRAIN_FIELDS and k not in ("compression", "model")}, where)
        every_method = grid["sync"] == ALL_METHODS
        backend = overrides.get("backend", train.get("backend", "auto"))
        if backend == "auto":  # judged here, where the sweep is launched
            import torch

            backend = "nccl" if torch.cuda.is_available() else "gloo"
        grid_runs = []
        for setting in settings:
            sizes = _as_list(grid["np"]) if "np" in grid else [setting.slots]
            grid_runs += [(setting, np) for np in sizes if setting is None or network.holds(setting, np)]
        if not grid_runs:
            ranges = ", ".join(f"{s.hosts} host(s): {(s.hosts - 1) * s.ranks_per_host + 1}..{s.slots}"
                               for s in settings)
            raise reader.fail(where + ("np",), f"no world size fits the [network] hosts: np must fill them, more than "
                              f"(hosts - 1) × ranks_per_host and at most hosts × ranks_per_host ({ranges}).",
                              line_of=where)
        for model, method, compression, (setting, np), seed in itertools.product(
                models, methods, compressions, grid_runs, _as_list(grid.get("seed", DEFAULT_SEED))):
            refused = combination_error(method, compression)
            if every_method and SYNC_METHODS[method].fixed_compression and compression != "none":
                continue  # flat_fp16 and the like: already in the grid once, with their own compression
            if every_method and (refused or backend_error(method, backend)):
                entry = (label(method, compression), refused or backend_error(method, backend))
                if entry not in unavailable:
                    unavailable.append(entry)
                continue
            if refused:
                raise reader.fail(where + ("compression" if "compression" in grid else "sync",), refused)
            link = {"link": setting.link} if setting else {}
            config = TrainConfig(**{**train, **overrides, "sync": method, "compression": compression, "seed": seed,
                                    "model": model, **link})
            try:
                config.validate(np)
            except UserError as error:  # the options do not suit this world size (e.g. the batch does not split)
                raise reader.fail(where + ("np",), f"the run {method} at np {np} cannot start: {error}") from None
            name = (f"{label(method, compression)}-np{np}-seed{seed}" + (f"-{setting.label}" if setting else "")
                    + (f"-{model}" if isinstance(grid.get("model"), list) else ""))
            if any(run.name == name for run in runs):  # the same triple in two grids with different options
                named_by = {**overrides, **({"model": model} if "model" in grid else {})}
                name = _distinct(name, named_by, {run.name for run in runs}, len(runs) + 1)
            runs.append(PlannedRun(len(runs) + 1, name, np, config, dict(env), setting))

    if not runs and sweeps:
        raise reader.fail(("sweep",), "no run is left to launch: every method in the grid is unavailable here ("
                          + "; ".join(f"{name}: {why}" for name, why in unavailable) + ").")
    bench = None
    if "bench" in data:
        table = dict(data["bench"])
        if network:  # np picks the settings the bench runs on
            sizes = _as_list(table.pop("np", [s.slots for s in settings]))
            chosen = tuple(s for s in settings if s.slots in sizes)
            if not chosen:
                raise reader.fail(("bench", "np"), f"no [network] setting has {' or '.join(map(str, sizes))} ranks; "
                                  f"they have {', '.join(sorted({str(s.slots) for s in settings}, key=int))}.")
            table.update(np=max(s.slots for s in chosen), settings=chosen)
        elif isinstance(table.get("np"), list):
            raise reader.fail(("bench", "np"), "must be one integer without [network] (a list picks network settings).")
        defaults = {"np": max(run.np for run in runs) if runs else 1, "batch_size": train.get("batch_size", 256)}
        bench = BenchPlan(**{**defaults, **table,
                             **({"methods": tuple(table["methods"])} if "methods" in table else {})})
        if bench.methods:
            try:
                parse_labels(",".join(bench.methods))
            except UserError as error:
                raise reader.fail(("bench", "methods"), str(error)) from None
        for key in ("np", "steps", "batch_size"):
            if getattr(bench, key) < 1:
                raise reader.fail(("bench", key), f"must be at least 1, got {getattr(bench, key)}.")
        for np in [bench.np] if network is None else [setting.slots for setting in bench.settings]:
            if bench.batch_size % np:
                raise reader.fail(("bench", "batch_size"), f"{bench.batch_size} must split evenly across np {np}.")
        try:
            resolve(bench.model)  # any model training takes
        except UserError as error:
            raise reader.fail(("bench", "model"), str(error).replace("--model ", "model ", 1)) from None
        if bench.gpt_size is not None and (bench.gpt_size not in GPT_SIZES or bench.model != "gpt"):
            raise reader.fail(("bench", "gpt_size"), f"is gpt's size, one of {', '.join(GPT_SIZES)}, with model = "
                              f'"gpt"; got {bench.gpt_size!r} with model {bench.model!r}.')

    target = experiment.get("target_accuracy")
    if target is not None and not 0 < target <= 1:
        raise reader.fail(("experiment", "target_accuracy"), f"must be a fraction in (0, 1], e.g. 0.6 for 60%, got "
                                                             f"{target}.")
    target_loss = experiment.get("target_loss")
    if target_loss is not None and target is not None:
        raise reader.fail(("experiment", "target_loss"), f"the report races to one target, and target_accuracy = "
                          f"{target} is set too. Keep target_accuracy for image models and target_loss (a "
                          f"validation loss) for language models; without either, a sweep of language models races "
                          f"to a validation loss.")
    if target_loss is not None and not target_loss > 0:
        raise reader.fail(("experiment", "target_loss"), f"must be a positive validation loss, e.g. 2.0 nats per "
                                                         f"byte for gpt, got {target_loss}.")
    launch = data.get("launch", {})
    name = experiment["name"]
    return Sweep(
        path=path, name=name, description=experiment.get("description", ""),
        tracking=experiment.get("tracking", True), tracking_uri=experiment.get("tracking_uri"),
        out=Path(experiment.get("out", f"results/{name}")),
        hostfile=launch.get("hostfile", "hostfile") or None,
        mpirun_args=tuple(launch.get("mpirun_args", ("--bind-to", "none"))),
        timeout=launch.get("timeout"), runs=tuple(runs), bench=bench, network=network,
        unavailable=tuple(unavailable), target_accuracy=target, target_loss=target_loss,
    )


def _network(reader: _Reader, table: dict) -> NetworkPlan:
    """The [network] table: hosts, ranks per host, link rates and where the test hosts live."""
    hosts = _as_list(table.get("hosts", [1]))
    for count in hosts:
        if not 1 <= count <= 250:
            raise reader.fail(("network", "hosts"), f"numbers of hosts must be 1 to 250, got {count}.")
    ranks_per_host = _as_list(table.get("ranks_per_host", 2))
    for count in ranks_per_host:
        if count < 1:
            raise reader.fail(("network", "ranks_per_host"), f"must be at least 1, got {count}.")
    links = _as_list(table.get("link", "unlimited"))
    for link in links:
        try:
            rate_bytes_per_s(link)
        except ValueError as error:
            raise reader.fail(("network", "link"), f"{error}.") from None
    prefix = table.get("prefix", NetworkPlan.prefix)
    if not re.fullmatch(r"[a-z][a-z0-9]{0,9}", prefix):
        raise reader.fail(("network", "prefix"), f"{prefix!r} must be 1 to 10 lower-case letters and digits, starting "
                          f"with a letter (interface names allow 15 characters).")
    subnet = table.get("subnet", NetworkPlan.subnet)
    if not re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", subnet) or any(int(x) > 255 for x in subnet.split(".")):
        raise reader.fail(("network", "subnet"), f"{subnet!r} must be the first three numbers of a /24 network, e.g. "
                          f'"10.80.0".')
    return NetworkPlan(tuple(dict.fromkeys(hosts)), tuple(dict.fromkeys(ranks_per_host)),
                       tuple(dict.fromkeys(l.lower() for l in links)), prefix, subnet)


def _distinct(name: str, options: dict, taken: set[str], number: int) -> str:
    """A run name that says how this grid differs: its own options appended (`-mnist_cnn`, `-lr0.1`), else its
    number."""
    parts = [str(v) if isinstance(v, str) else f"{k}{v}" for k, v in options.items()
             if k not in ("sync", "seed") and isinstance(v, (str, int, float))]
    candidate = "-".join([name, *parts])
    return candidate if parts and candidate not in taken else f"{name}-run{number}"


def load(path: str | Path) -> Sweep:
    """Read and check an experiment file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise UserError(f"cannot read the experiment file {path}: {error.strerror or error}. Give the path of a "
                        f".toml file, e.g. experiments/smoke.toml.") from None
    return parse(text, path)
