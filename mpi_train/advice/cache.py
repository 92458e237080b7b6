"""Advice files: where `python -m mpi_train advise` keeps them, which one fits a job, and what --sync auto takes.

An advice is a JSON written for one setting: each rank's host (so the world size and how the
ranks share hosts), the model, the global batch and the --precision it was given (with what that
ran as there: auto's pick). It holds the calibrated links under
"calibration" (as a bench JSON does, so a job's --calibration reads it too) with when they were
measured, every candidate's predicted step and the measured step of those the short bench
timed, and the recommendation, whose `flags` are arguments to add to `python -m mpi_train`.
Files are named after their setting and time, under mlruns/advice/ unless --advice-dir says
otherwise; the newest that fits is the one taken, by a later advise for its calibration (same
hosts and link) and by --sync auto for its recommendation (same hosts, model, batch and world
size, and a job's --precision that is the advice's as given or as it ran: a job at another
precision computes faster or slower, which can change the fastest method).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import ADVICE_DIR, SYNC_AUTO, TrainConfig
from ..errors import UserError
from ..files import write_json_atomically
from ..netmodel import network_problem
from ..step.precision import PRECISION_AUTO, UNNAMED_PRECISION
from ..sync import GRADIENTS, SYNC_METHODS

ADVISED = ("sync", "bucket_mb")  # the flags an advice sets
KIND = "mpi_train.advice"  # the "kind" of every advice file, so a stray JSON in the folder is not taken for one
VERSION = 1


@dataclass(frozen=True)
class Setting:
    """What an advice holds for: each rank's host, the model, the global batch, the --precision as given."""

    hosts: tuple[str, ...]
    model: str
    batch_size: int
    precision: str = PRECISION_AUTO

    @classmethod
    def of(cls, data: dict) -> Setting:
        """The setting an advice was made for (one that names no precision was given none: auto)."""
        return cls(tuple(data.get("hosts") or ()), data.get("model"), data.get("batch_size"),
                   data.get("precision_flag", PRECISION_AUTO))

    @property
    def world_size(self) -> int:
        return len(self.hosts)

    def describe(self) -> str:
        """`vgg11, batch 256, 4 ranks on testhost1 (2), testhost2 (2)`, with `--precision 16-mixed` where given."""
        counts = {host: self.hosts.count(host) for host in dict.fromkeys(self.hosts)}
        return (f"{self.model}, batch {self.batch_size}, "
                + (f"--precision {self.precision}, " if self.precision != PRECISION_AUTO else "")
                + f"{self.world_size} rank(s) on " + ", ".join(f"{host} ({count})" for host, count in counts.items()))

    def differences(self, data: dict) -> list[str]:
        """How an advice's setting differs from this one, in words; [] when it fits. A job's --precision fits an
        advice's as given (auto and auto on the same hosts pick alike) or as it ran (bf16-mixed fits an advice whose
        auto ran bf16-mixed)."""
        found = []
        if data.get("model") != self.model:
            found.append(f"model {data.get('model')} (this job: {self.model})")
        if data.get("batch_size") != self.batch_size:
            found.append(f"batch {data.get('batch_size')} (this job: {self.batch_size})")
        given, ran = data.get("precision_flag", PRECISION_AUTO), data.get("precision", UNNAMED_PRECISION)
        if self.precision not in (given, ran):
            found.append(f"--precision {given}" + (f", which ran {ran}" if given != ran else "")
                         + f" (this job: --precision {self.precision})")
        if data.get("world_size") != self.world_size:
            found.append(f"{data.get('world_size')} ranks (this job: {self.world_size})")
        elif tuple(data.get("hosts") or ()) != self.hosts:
            found.append(f"hosts {', '.join(dict.fromkeys(data.get('hosts') or ()))} (this job: "
                         f"{', '.join(dict.fromkeys(self.hosts))})")
        return found

    def path(self, folder: str | Path, created_s: float) -> Path:
        """Where `write` keeps this setting's advice made at `created_s`:
        `FOLDER/vgg11-b256-np4-1a2b3c4d-20261125-193000.json`, its hosts as a digest."""
        digest = hashlib.sha256("\n".join(self.hosts).encode()).hexdigest()[:8]
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(created_s))
        return Path(folder) / f"{self.model}-b{self.batch_size}-np{self.world_size}-{digest}-{stamp}.json"


def read(path: str | Path) -> dict:
    """An advice file's contents; a UserError when it cannot be read, is not an advice, or was damaged."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise UserError(f"cannot read the advice {path}: {error.strerror or error}. Give a JSON written by python -m "
                        f"mpi_train advise, or a folder of them.") from None
    except ValueError as error:
        raise UserError(f"the advice {path} is not JSON ({error}); write one with python -m "
                        f"mpi_train advise.") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or not isinstance(data.get("recommended"), dict):
        raise UserError(f"{path} is not an advice of python -m mpi_train advise (no \"kind\": {KIND!r} with a "
                        f"recommendation); write one with python -m mpi_train advise --json PATH.")
    problem = damage(data)
    if problem:
        raise UserError(f"the advice {path} cannot be used: {problem}. It was changed after the advisor wrote it, or "
                        f"by another version; run python -m mpi_train advise again (and delete this one).")
    return data


def damage(data: dict) -> str | None:
    """What in an advice's contents no advisor of this version writes, in words; None when all of it reads."""
    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    hosts, flags = data.get("hosts"), data["recommended"].get("flags")
    version = data.get("version", VERSION)
    found = [
        (not number(version) or version > VERSION, f"its version {version!r} is newer than this one's ({VERSION})"),
        (not number(data.get("created_s")), f"its created_s {data.get('created_s')!r} is no time"),
        (not (isinstance(hosts, list) and hosts and all(isinstance(host, str) for host in hosts)),
         f"its hosts {hosts!r} are not a list of host names"),
        (not isinstance(data.get("model"), str), f"its model {data.get('model')!r} is not a name"),
        (not (isinstance(data.get("batch_size"), int) and data["batch_size"] > 0),
         f"its batch_size {data.get('batch_size')!r} is not a whole number above 0"),
        (not isinstance(hosts, list) or data.get("world_size") != len(hosts),
         f"its world_size {data.get('world_size')!r} does not count its hosts"),
        (not (isinstance(flags, list) and all(isinstance(flag, str) for flag in flags)),
         f"its recommended flags {flags!r} are not a list of strings"),
    ]
    problem = next((why for wrong, why in found if wrong), None)
    network = (data.get("calibration") or {}).get("network") if isinstance(data.get("calibration"), dict) else None
    return problem or (network_problem(network) if network is not None else None)


def advice_in(folder: str | Path) -> list[tuple[Path, dict]]:
    """Every advice file in `folder`, oldest first; other files, and a folder that does not exist, give none."""
    found = []
    for path in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        try:
            found.append((path, read(path)))
        except UserError:
            continue
    return sorted(found, key=lambda item: item[1]["created_s"])


def newest(folder: str | Path, fits: Callable[[dict], bool]) -> tuple[Path, dict] | None:
    """The newest advice in `folder` that `fits`, with its path."""
    return next(((path, data) for path, data in reversed(advice_in(folder)) if fits(data)), None)


def reusable_calibration(folder: str | Path, hosts: Sequence[str], link: str | None) -> tuple[Path, dict] | None:
    """The newest advice whose links were calibrated on these hosts (each rank's, in order) at this --link rate."""
    return newest(folder, lambda data: (tuple(data.get("hosts") or ()) == tuple(hosts) and data.get("link") == link
                                        and bool((data.get("calibration") or {}).get("network"))))


def write(path: Path, data: dict) -> Path:
    """Keep the advice `data` at `path` (Setting.path), whole or not at all; `path`."""
    write_json_atomically(str(path), data)
    return path


def age(seconds: float) -> str:
    """`45 s`, `12 min`, `3 h 12 min`, `2 days 4 h`."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} day{'s' if days > 1 else ''} {hours} h"


def advise_command(setting: Setting) -> str:
    """The advisor's launch line for a setting, to print where no advice fits."""
    return (f"mpirun -np {setting.world_size} --hostfile HOSTFILE python -m mpi_train advise --model {setting.model} "
            f"--batch-size {setting.batch_size}"
            + (f" --precision {setting.precision}" if setting.precision != PRECISION_AUTO else ""))


def follow(config: TrainConfig, hosts: Sequence[str], now: float | None = None) -> dict:
    """Rank 0 under --sync auto: the advice to follow for this job (--advice, a file or a folder, else the newest
    fitting one under mlruns/advice/) as {file, created, age_s, label, flags, why, predicted and measured step};
    a UserError that says what to run when none fits."""
    setting = Setting(tuple(hosts), config.model_name, config.batch_size, config.precision)
    if config.compression != "none":
        raise UserError(f"--sync auto picks a lossless method, which sends the gradients as they are, and cannot "
                        f"carry --compression {config.compression}. Drop --compression, or name the method with "
                        f"--sync (python -m mpi_train advise lists the lossy options apart, with their accuracy cost).")
    place = Path(config.advice or ADVICE_DIR)
    if config.advice and not place.exists():
        raise UserError(f"--advice {place} does not exist. Give an advice JSON of python -m mpi_train advise or a "
                        f"folder of them, or leave --advice out to take the newest under {ADVICE_DIR}/.")
    note = None
    if place.is_file():
        data = read(place)
        different = setting.differences(data)
        if different and not different[0].startswith("hosts"):
            raise UserError(f"--advice {place} was made for another setting: {'; '.join(different)}. Its "
                            f"recommendation does not apply to this job. Run the advisor for this one first: "
                            f"{advise_command(setting)}; or name a method with --sync.")
        if different:
            note = f"made for {different[0]}: followed as --advice asks"
        path = place
    else:
        found = newest(place, lambda data: not setting.differences(data))
        if found is None:
            held = sorted({Setting.of(data).describe() for _, data in advice_in(place)})
            there = f"; it holds advice for: {'; '.join(held)}" if held else ", which holds none"
            raise UserError(f"--sync auto found no advice for this job ({setting.describe()}) in {place}/{there}. "
                            f"Run the advisor with this job's hostfile and flags first: {advise_command(setting)} "
                            f"(with --advice-dir DIR, pass --advice DIR here); or name a method with --sync, e.g. "
                            f"--sync ddp.")
        path, data = found
    recommended = data["recommended"]
    created = data["created_s"]
    return {"file": str(path), "created": data.get("created"), "age_s": (now or time.time()) - created,
            "label": recommended.get("label"), "flags": list(recommended.get("flags") or []),
            "why": recommended.get("why", ""), "predicted_step_s": recommended.get("predicted_step_s"),
            "measured_step_s": recommended.get("measured_step_s"), "note": note}


def described(pick: dict) -> str:
    """One line on what --sync auto took and why, as printed and tagged."""
    steps = [f"{what} {pick[key] * 1e3:,.0f} ms" for what, key in (("predicted", "predicted_step_s"),
                                                                  ("measured", "measured_step_s"))
             if isinstance(pick.get(key), (int, float))]
    return (f"--sync auto runs {' '.join(pick['flags'])}, as the advice {pick['file']} ({age(pick['age_s'])} old"
            + (f"; {pick['note']}" if pick.get("note") else "") + ") recommends"
            + (f": {', '.join(steps)} per step" if steps else "") + (f". {pick['why']}" if pick.get("why") else ""))


def applied(config: TrainConfig, pick: dict) -> TrainConfig:
    """The job's config with the advice's flags (`--sync bucketed --bucket-mb 8`) in place of --sync auto. An advice
    names a lossless method and its bucket size, nothing else: it never changes what the job was told to train."""
    flags, changes = list(pick["flags"]), {}
    for flag, value in zip(flags[::2], flags[1::2]):
        name = flag.removeprefix("--").replace("-", "_")
        if not flag.startswith("--") or name not in ADVISED:
            raise UserError(f"the advice {pick['file']} recommends {flag} {value!r}, and an advice sets --sync and "
                            f"--bucket-mb only (an advice of another version, or edited by hand?). Run python -m "
                            f"mpi_train advise again.")
        changes[name] = advised_value(name, value)
        if changes[name] is None:
            wrong = (f"is not one of this version's lossless methods ({', '.join(lossless_methods())})"
                     if name == "sync" else "is not a size in MB above 0")
            raise UserError(f"the advice {pick['file']} recommends {flag} {value!r}, which {wrong}. Run python -m "
                            f"mpi_train advise again.")
    if len(flags) % 2 or "sync" not in changes:
        raise UserError(f"the advice {pick['file']} recommends {' '.join(flags) or 'nothing'}, which names no sync "
                        f"method of this version. Run python -m mpi_train advise again.")
    return dataclasses.replace(config, **changes, advice=pick["file"])


def advised_value(name: str, value: str):
    """`value` as field `name` (ADVISED) takes it, or None where no advisor of this version would have written it."""
    if name == "sync":
        return value if value in lossless_methods() else None
    try:
        size = float(value)
    except ValueError:
        return None
    return size if 0 < size < math.inf else None


def lossless_methods() -> list[str]:
    """The methods an advice may name: those that average the gradients as they are (what --sync auto promises)."""
    return [name for name, method in SYNC_METHODS.items()
            if method.traits.averages == GRADIENTS and not method.traits.fixed_compression]


def resolve(config: TrainConfig, cluster) -> tuple[TrainConfig, dict | None]:
    """Under --sync auto, the config with the advised flags and the advice followed (rank 0 reads it, every rank
    takes rank 0's pick); any other job as it is. Collective; every rank raises the same UserError together."""
    if config.sync != SYNC_AUTO:
        if config.advice:
            raise UserError(f"--advice is read by --sync auto only, and this job runs --sync {config.sync}. Drop "
                            f"--advice, or use --sync auto.")
        return config, None
    pick, problem = None, None
    if cluster.info.is_main:
        try:
            pick = follow(config, cluster.hosts)
        except UserError as error:
            problem = str(error)
    decided = cluster.bcast({"pick": pick, "problem": problem})
    if decided["problem"]:
        raise UserError(decided["problem"])
    return applied(config, decided["pick"]), decided["pick"]
