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

import difflib
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

from ..config import TrainConfig
from ..config.job_file import read_toml, toml_mistake
from ..errors import UserError
from ..models import GPT_SIZES, resolve
from ..sync import COMPRESSORS, SYNC_METHODS, backend_error, combination_error, label, parse_labels
from .experiment_keys import SECTIONS, SWEEP_KEYS, TRAIN_FIELDS, KeyChecker, SweepError, options_it_reads, show
from .network import NetworkPlan, NetworkSetting, link_error, prefix_error, subnet_error

ALL_METHODS = "all"
GRID_AXES = ("sync", "compression", "np", "seed", "model")  # a grid's lists, whose product is its runs
DEFAULT_SEED = 42


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
    """The [bench] table: the benchmark run whose cost table the report shows."""

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


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def parse(text: str, path: Path) -> Sweep:
    """Check an experiment file's text; raises SweepError (file, line, key) on the first mistake."""
    path = Path(path)
    data = _toml(text, path)
    checker = KeyChecker(path, text)
    _check_tables(checker, data)
    network = _network(checker, data["network"]) if "network" in data else None
    experiment = data.get("experiment", {})
    _check_name(checker, experiment)
    train = _train(checker, data.get("train", {}))
    grids = _grids(checker, data, network)
    runs: list[PlannedRun] = []
    unavailable: list[tuple[str, str]] = []
    for number, grid in enumerate(grids):
        _plan_grid(checker, ("sweep", number), grid, train, network, runs, unavailable)
    if not runs and grids:
        raise checker.fail(("sweep",), "no run is left to launch: every method in the grid is unavailable here ("
                           + "; ".join(f"{name}: {why}" for name, why in unavailable) + ").")
    bench = _bench(checker, data["bench"], train, runs, network) if "bench" in data else None
    target_accuracy, target_loss = _targets(checker, experiment)
    launch = data.get("launch", {})
    if "timeout" in launch and not 0 < launch["timeout"] < math.inf:
        raise checker.fail(("launch", "timeout"), f"is how many seconds one run may take before it is stopped, a "
                                                  f"number above 0 (no limit: leave it out); got {launch['timeout']}.")
    name = experiment["name"]
    return Sweep(
        path=path, name=name, description=experiment.get("description", ""),
        tracking=experiment.get("tracking", True), tracking_uri=experiment.get("tracking_uri"),
        out=Path(experiment.get("out", f"results/{folder_name(name)}")),
        hostfile=launch.get("hostfile", "hostfile") or None,
        mpirun_args=tuple(launch.get("mpirun_args", ("--bind-to", "none"))),
        timeout=launch.get("timeout"), runs=tuple(runs), bench=bench, network=network,
        unavailable=tuple(unavailable), target_accuracy=target_accuracy, target_loss=target_loss,
    )


def _toml(text: str, path: Path) -> dict:
    """The file's tables; a syntax error names its line, as every other mistake does."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line, message = toml_mistake(error)
        raise SweepError(path, line, "(syntax)", f"this is not valid TOML: {message}. See https://toml.io for the "
                         f"syntax (strings in quotes, lists in [ ], one key = value per line).") from None


def _check_tables(checker: KeyChecker, data: dict) -> None:
    """The file's tables are known ones, and every key of [experiment], [launch], [network] and [bench] is known
    and of its type."""
    options = [key for key in data if key in TRAIN_FIELDS and key not in (*SECTIONS, "train", "sweep")]
    if options and "sweep" not in data:  # a job file's training options at the top level
        raise checker.fail((options[0],), f"is a training option at the file's top level, where an experiment file "
                           f"holds [experiment], [train] and [[sweep]] tables: this looks like a job file. Run it with "
                           f"python -m mpi_train --config {checker.path}, or put its options under [train] and add a "
                           f"[[sweep]] (docs/experiments.md).")
    checker.check_keys(data, [*SECTIONS, "train", "sweep"], ())
    for section in (*SECTIONS, "train"):
        if section in data and not isinstance(data[section], dict):
            raise checker.fail((section,), f"must be a table ([{section}]), got {show(data[section])}.")
    for section, keys in SECTIONS.items():
        table = data.get(section, {})
        checker.check_keys(table, keys, (section,))
        for key, value in table.items():
            checker.check_type(value, keys[key], (section, key))


def _check_name(checker: KeyChecker, experiment: dict) -> None:
    """[experiment] name is the one key every file needs: the runs are filed under it."""
    if "name" not in experiment or not experiment["name"].strip():
        raise checker.fail(("experiment", "name"), "is required: the MLflow experiment every run is filed under, "
                           'e.g. [experiment] name = "compare_sync".', line_of=("experiment",))


def _train(checker: KeyChecker, table: dict) -> dict:
    """The [train] table: options of every run."""
    checker.check_keys(table, TRAIN_FIELDS, ("train",))
    return checker.check_train(table, ("train",))


def _grids(checker: KeyChecker, data: dict, network: NetworkPlan | None) -> list[dict]:
    """The [[sweep]] tables; a lab may leave them out and measure with the bench alone."""
    grids = data.get("sweep", [] if network and "bench" in data else None)
    if not isinstance(grids, list) or (not grids and "sweep" in data):
        raise checker.fail(("sweep",), "at least one [[sweep]] table is needed, e.g. [[sweep]] sync = \"all\" np = [4] "
                           "(or, with [network], a [bench] table alone).")
    return grids


# ---------------------------------------------------------------------------------------------
# One [[sweep]] table: its keys checked one group at a time, then crossed into runs.

def _plan_grid(checker: KeyChecker, where: tuple, grid: dict, train: dict, network: NetworkPlan | None,
               runs: list[PlannedRun], unavailable: list[tuple[str, str]]) -> None:
    """Append the grid's runs to `runs` in file order; what a sync = "all" grid cannot run here goes to
    `unavailable`."""
    _check_grid(checker, where, grid, network)
    methods = _methods(checker, where, grid)
    for np in _as_list(grid.get("np", [])):
        if np < 1:
            raise checker.fail(where + ("np",), f"world sizes must be at least 1, got {np}.")
    compressions = _compressions(checker, where, grid, train)
    models = _models(checker, where, grid, train)
    overrides = checker.check_train({k: v for k, v in grid.items()
                                     if k in TRAIN_FIELDS and k not in ("compression", "model")}, where)
    backend = _backend(overrides.get("backend", train.get("backend", "auto")))
    placements = _placements(checker, where, grid, network)
    seeds = _as_list(grid.get("seed", DEFAULT_SEED))
    pairs = list(itertools.product(methods, compressions))
    for model, method, compression, (setting, np), seed in itertools.product(
            models, methods, compressions, placements, seeds):
        if grid["sync"] == ALL_METHODS and _left_out_of_all(method, compression, backend, unavailable):
            continue
        refused = combination_error(method, compression)
        if refused:
            raise checker.fail(where + ("compression" if "compression" in grid else "sync",), refused)
        link = {"link": setting.link} if setting else {}
        options = options_it_reads({**train, **overrides, "sync": method, "compression": compression, "seed": seed,
                                    "model": model, **link}, pairs)
        config = _run_config(checker, where, grid, train, options, np)
        name = (f"{label(method, compression)}-np{np}-seed{seed}" + (f"-{setting.label}" if setting else "")
                + (f"-{model}" if isinstance(grid.get("model"), list) else ""))
        same = next((run for run in runs if (run.config, run.np, run.env, run.network) ==
                     (config, np, dict(grid.get("env", {})), setting)), None)
        if same is not None:
            raise checker.fail(where, f"gives the run {same.name} a second time (run {same.index} of the sweep) "
                                      f"with the same options. Remove it from one of the grids.", line_of=where)
        if any(run.name == name for run in runs):  # the same triple in two grids with different options
            named_by = {**overrides, **({"model": model} if "model" in grid else {})}
            name = _distinct(name, named_by, {run.name for run in runs}, len(runs) + 1)
        runs.append(PlannedRun(index=len(runs) + 1, name=name, np=np, config=config, env=dict(grid.get("env", {})),
                               network=setting))


def _check_grid(checker: KeyChecker, where: tuple, grid: dict, network: NetworkPlan | None) -> None:
    """Known keys, the required ones, each of its type, and an environment of strings."""
    checker.check_keys(grid, [*SWEEP_KEYS, *TRAIN_FIELDS], where)
    if "sync" not in grid or ("np" not in grid and network is None):
        missing = "sync" if "sync" not in grid else "np"
        raise checker.fail(where + (missing,), "is required in every [[sweep]] (the grid is sync × np × seed).",
                           line_of=where)
    for key, expected in SWEEP_KEYS.items():
        if key in grid:
            checker.check_type(grid[key], expected, where + (key,))
    for variable, value in grid.get("env", {}).items():
        if not isinstance(value, str):
            raise checker.fail(where + ("env", variable), f"must be a string, got {show(value)}.")
    for axis in GRID_AXES:
        if isinstance(grid.get(axis), list):
            checker.check_once(grid[axis], where + (axis,))


def _methods(checker: KeyChecker, where: tuple, grid: dict) -> list[str]:
    """The grid's sync methods: those it names, or every registered one for "all"."""
    methods = list(SYNC_METHODS) if grid["sync"] == ALL_METHODS else _as_list(grid["sync"])
    for method in methods:
        if method not in SYNC_METHODS:
            close = difflib.get_close_matches(method, list(SYNC_METHODS), n=1)
            raise checker.fail(where + ("sync",), f"unknown sync method {method!r}."
                               f"{f' Did you mean {close[0]!r}?' if close else ''} Registered methods: "
                               f"{', '.join(SYNC_METHODS)} (or \"{ALL_METHODS}\" for every one).")
    return methods


def _compressions(checker: KeyChecker, where: tuple, grid: dict, train: dict) -> list[str]:
    """The grid's compressions, else [train]'s one, else none."""
    compressions = _as_list(grid.get("compression", train.get("compression", "none")))
    for compression in compressions:
        if compression not in COMPRESSORS:
            raise checker.fail(where + ("compression",), f"unknown compression {compression!r}; choose from "
                               f"{', '.join(COMPRESSORS)}.")
    return compressions


def _models(checker: KeyChecker, where: tuple, grid: dict, train: dict) -> list[str | None]:
    """The grid's models, else [train]'s one, else the data set's default (None)."""
    models = _as_list(grid.get("model", train.get("model")))
    for model in models:
        if model is not None:
            try:
                resolve(model)
            except UserError as error:
                raise checker.fail(where + ("model",) if "model" in grid else ("train", "model"),
                                   str(error).replace("--model ", "model ", 1)) from None
    return models


def _backend(backend: str) -> str:
    """The backend the runs will use: "auto" is judged here, where the sweep is launched."""
    if backend != "auto":
        return backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def _placements(checker: KeyChecker, where: tuple, grid: dict, network: NetworkPlan | None) -> list[tuple]:
    """(network setting, world size) of each run: with [network], only the sizes that fill a setting's hosts."""
    settings = network.settings if network else (None,)
    placements = []
    for setting in settings:
        sizes = _as_list(grid["np"]) if "np" in grid else [setting.slots]
        placements += [(setting, np) for np in sizes if setting is None or network.holds(setting, np)]
    if not placements:
        ranges = ", ".join(f"{s.hosts} host(s): {(s.hosts - 1) * s.ranks_per_host + 1}..{s.slots}" for s in settings)
        raise checker.fail(where + ("np",), f"no world size fits the [network] hosts: np must fill them, more than "
                           f"(hosts - 1) × ranks_per_host and at most hosts × ranks_per_host ({ranges}).",
                           line_of=where)
    return placements


def _accepted(config: TrainConfig, np: int) -> bool:
    try:
        config.validate(np)
    except UserError:
        return False
    return True


def _left_out_of_all(method: str, compression: str, backend: str, unavailable: list[tuple[str, str]]) -> bool:
    """Whether a sync = "all" grid skips this pair; one that cannot run here is added to `unavailable`, once."""
    if SYNC_METHODS[method].traits.fixed_compression and compression != "none":
        return True  # flat_fp16 and the like: already in the grid once, with their own compression
    why = combination_error(method, compression) or backend_error(method, backend)
    if why and (label(method, compression), why) not in unavailable:
        unavailable.append((label(method, compression), why))
    return bool(why)


def _run_config(checker: KeyChecker, where: tuple, grid: dict, train: dict, options: dict, np: int) -> TrainConfig:
    """One run's training options, checked against its world size (e.g. the batch must split across it). A refusal
    that this world size alone brings is placed at np; any other at the first key it names as a flag (in the grid,
    else in [train])."""
    config = TrainConfig(**options)
    try:
        config.validate(np)
    except UserError as error:
        key = where + ("np",)
        if not any(_accepted(config, other) for other in (1, 2) if other != np):
            named = [flag.replace("-", "_") for flag in re.findall(r"--([a-z][a-z0-9-]*)", str(error))]
            key = next((where + (key,) if key in grid else ("train", key) for key in named
                        if key in grid or key in train), key)
        raise checker.fail(key, f"the run {options['sync']} at np {np} cannot start: {error}") from None
    return config


def _distinct(name: str, options: dict, taken: set[str], number: int) -> str:
    """A run name that says how this grid differs: its own options appended (`-mnist_cnn`, `-lr0.1`), else its
    number."""
    parts = [str(v) if isinstance(v, str) else f"{k}{v}" for k, v in options.items()
             if k not in ("sync", "seed") and isinstance(v, (str, int, float))]
    candidate = "-".join([name, *parts])
    return candidate if parts and candidate not in taken else f"{name}-run{number}"


# ---------------------------------------------------------------------------------------------
# The other tables.

def _bench(checker: KeyChecker, table: dict, train: dict, runs: list[PlannedRun],
           network: NetworkPlan | None) -> BenchPlan:
    """The [bench] table: one run at its np, or with [network] one on each setting its np picks."""
    table = dict(table)
    if network:
        settings = network.settings
        sizes = _as_list(table.pop("np", [s.slots for s in settings]))
        chosen = tuple(s for s in settings if s.slots in sizes)
        if not chosen:
            raise checker.fail(("bench", "np"), f"no [network] setting has {' or '.join(map(str, sizes))} ranks; "
                               f"they have {', '.join(sorted({str(s.slots) for s in settings}, key=int))}.")
        table.update(np=max(s.slots for s in chosen), settings=chosen)
    elif isinstance(table.get("np"), list):
        raise checker.fail(("bench", "np"), "must be one integer without [network] (a list picks network settings).")
    defaults = {"np": max(run.np for run in runs) if runs else 1, "batch_size": train.get("batch_size", 256)}
    bench = BenchPlan(**{**defaults, **table, **({"methods": tuple(table["methods"])} if "methods" in table else {})})
    _check_bench(checker, bench, network)
    return bench


def _check_bench(checker: KeyChecker, bench: BenchPlan, network: NetworkPlan | None) -> None:
    """Its method labels, sizes and model, as the bench itself would check them."""
    if bench.methods:
        try:
            parse_labels(",".join(bench.methods))
        except UserError as error:
            raise checker.fail(("bench", "methods"), str(error)) from None
    for key in ("np", "steps", "batch_size"):
        if getattr(bench, key) < 1:
            raise checker.fail(("bench", key), f"must be at least 1, got {getattr(bench, key)}.")
    for np in [bench.np] if network is None else [setting.slots for setting in bench.settings]:
        if bench.batch_size % np:
            raise checker.fail(("bench", "batch_size"), f"{bench.batch_size} must split evenly across np {np}.")
    try:
        resolve(bench.model)  # any model training takes
    except UserError as error:
        raise checker.fail(("bench", "model"), str(error).replace("--model ", "model ", 1)) from None
    if bench.gpt_size is not None and (bench.gpt_size not in GPT_SIZES or bench.model != "gpt"):
        raise checker.fail(("bench", "gpt_size"), f"is gpt's size, one of {', '.join(GPT_SIZES)}, with model = "
                           f'"gpt"; got {bench.gpt_size!r} with model {bench.model!r}.')


def folder_name(name: str) -> str:
    """The default output folder's name for an experiment `name`: MLflow takes any name ("team/run 1", "../x"),
    and a folder under results/ must neither nest nor climb out of it."""
    return re.sub(r"[^\w.-]+", "_", name).strip("._") or "experiment"


def _targets(checker: KeyChecker, experiment: dict) -> tuple[float | None, float | None]:
    """The report's target: a test accuracy or a validation loss, not both."""
    target = experiment.get("target_accuracy")
    if target is not None and not 0 < target <= 1:
        raise checker.fail(("experiment", "target_accuracy"), f"must be a fraction in (0, 1], e.g. 0.6 for 60%, got "
                                                              f"{target}.")
    target_loss = experiment.get("target_loss")
    if target_loss is not None and target is not None:
        raise checker.fail(("experiment", "target_loss"), f"the report races to one target, and target_accuracy = "
                           f"{target} is set too. Keep target_accuracy for image models and target_loss (a "
                           f"validation loss) for language models; without either, a sweep of language models races "
                           f"to a validation loss.")
    if target_loss is not None and not 0 < target_loss < math.inf:
        raise checker.fail(("experiment", "target_loss"), f"must be a positive validation loss, e.g. 2.0 nats per "
                                                          f"byte for gpt, got {target_loss}.")
    return target, target_loss


def _network(checker: KeyChecker, table: dict) -> NetworkPlan:
    """The [network] table: hosts, ranks per host, link rates and where the test hosts live."""
    hosts = _as_list(table.get("hosts", [1]))
    checker.check_once(hosts, ("network", "hosts"))
    for count in hosts:
        if not 1 <= count <= 250:
            raise checker.fail(("network", "hosts"), f"numbers of hosts must be 1 to 250, got {count}.")
    ranks_per_host = _as_list(table.get("ranks_per_host", 2))
    checker.check_once(ranks_per_host, ("network", "ranks_per_host"))
    for count in ranks_per_host:
        if count < 1:
            raise checker.fail(("network", "ranks_per_host"), f"must be at least 1, got {count}.")
    links = _as_list(table.get("link", "unlimited"))
    checker.check_once(links, ("network", "link"), same=str.lower)
    for link in links:
        if problem := link_error(link):
            raise checker.fail(("network", "link"), problem)
    prefix = table.get("prefix", NetworkPlan.prefix)
    if problem := prefix_error(prefix):
        raise checker.fail(("network", "prefix"), problem)
    subnet = table.get("subnet", NetworkPlan.subnet)
    if problem := subnet_error(subnet):
        raise checker.fail(("network", "subnet"), problem)
    return NetworkPlan(hosts=tuple(hosts), ranks_per_host=tuple(ranks_per_host),
                       links=tuple(link.lower() for link in links), prefix=prefix, subnet=subnet)


def load(path: str | Path) -> Sweep:
    """Read and check an experiment file."""
    path = Path(path)
    text = read_toml(path, f"experiment file {path}", "Give the path of a .toml file, e.g. experiments/smoke.toml.")
    return parse(text, path)
