"""Checkpoints a job can resume from, exactly: the losses after a resume equal those of an uninterrupted run.

One file per checkpoint, `step-00000040.pt` under --checkpoint-dir, written by global rank 0 only: to a hidden
temporary file in the same folder, flushed and fsynced, then renamed over (os.replace is atomic on POSIX), so a crash
mid-write leaves at most a stray `.step-*.partial` file and never touches the last good checkpoint.

What a checkpoint holds, and why that is enough for an exact continuation:
- the job's identity, which check_compatible holds a resumed job to: the model and its shape (model_shape: each
  sample's, gpt's layers, heads and width), the data set, ranks, global batch and optimizer; and what a resumed job
  may change but is told of (loop/job.py changed_course): the precision, the seed and the sync method;
- the weights and the optimizer state (SGD's momentum, AdamW's moments and step) and the optimizer's name (a state
  loads only into the optimizer that kept it), from rank 0: every sync method
  leaves them identical on all ranks (the replica check at the end verifies it); a
  method that shards them (zero, fsdp, zero_torch) gathers them first, into the layout
  of one optimizer over the whole model, so any method resumes from any checkpoint, on
  the same number of ranks or, with --reshard, on another;
- the position: epoch and steps done in it. The sampler's order is a function of
  (seed, epoch), so the resumed job rebuilds the epoch's order and skips the batches
  already trained on by index, without loading them;
- per rank, gathered to rank 0 and stored in the same file: the torch, numpy and
  Python random states (each rank's own stream, seeded from (seed, rank), see
  randomness.py: dropout, augmentation and the loaders draw from them) and the rank's buffers (BatchNorm
  running statistics are each rank's own until the epoch's buffer average). One file
  rather than one per rank because then one rename makes the whole checkpoint appear
  at once; per-rank states are a few kilobytes each;
- the MLflow parent run id, so the resumed job's run can point at the run it continues;
- under --precision 16-mixed, the loss scaler's state (its scale, its count of clean steps towards the next growth,
  the steps skipped so far), the same on every rank: the resumed job scales as the uninterrupted one would have (a
  checkpoint without it, or a job at another precision, starts the scaler afresh).

--resume takes a checkpoint file, or a folder whose latest checkpoint is used. Rank 0 reads and checks it and sends
each rank its part over MPI, so only rank 0's host needs the file (it is the one that wrote it).

A damaged checkpoint (cut short, bytes overwritten: every part's checksum is checked, since torch.load reads
overwritten tensor bytes as values) stops a job that named it, and the message names the newest intact one beside it.
Under --resume auto the job goes on from the newest intact checkpoint by itself, says so in one line, and renames the
damaged file to `step-N.pt.damaged` (kept, never picked again): auto is what unattended relaunches use (the
supervisor, Slurm's requeue), where a stop waits for a person only to give the same answer.
"""

from __future__ import annotations

import copy
import errno
import os
import random
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .cluster import Cluster
from .config import RESUME_AUTO, TrainConfig, ranks_advice
from .config.model_shape import model_shape, shape_flags, shape_words, unfit_weights
from .errors import UserError, system_error
from .files import write_atomically
from .optimizers import told_by_state
from .sync import SyncMethod, label

FORMAT_VERSION = 1
NAME_PATTERN = re.compile(r"^step-(\d{8})\.pt$")
KEEP_LAST = 3  # older checkpoints are deleted once a newer one is safely on disk
DAMAGED_SUFFIX = ".damaged"  # a damaged checkpoint set aside by --resume auto: NAME_PATTERN no longer matches it


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def checkpoint_step(path: Path) -> int:
    """The step in a checkpoint's name (readable when the file is not)."""
    return int(NAME_PATTERN.match(path.name).group(1))


def list_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints in `folder`, oldest first (temporary files never match the pattern)."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), path) for path in folder.iterdir() if (m := NAME_PATTERN.match(path.name))]
    return [path for _, path in sorted(found)]


@dataclass(frozen=True)
class Position:
    """Where training stands: `step` optimizer steps done in all, `step_in_epoch` of them in `epoch` (1-based);
    and how long and how many bytes it took to get there (rank 0's: wall time training, evaluations left out, and
    bytes sent), so time and bytes to accuracy count across a resume."""

    epoch: int = 1
    step: int = 0
    step_in_epoch: int = 0
    elapsed_s: float = 0.0
    sent_bytes: float = 0.0


# ---------------------------------------------------------------------------------------------
# Each rank's own state.

def capture_rank_state(model: nn.Module, method_state: dict) -> dict:
    """This rank's random states, buffers and sync method state (`method_state`, what SyncMethod.save gave it), in
    types torch.load(weights_only=True) accepts."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": {"kind": kind, "keys": keys.tolist(), "pos": int(position), "has_gauss": int(has_gauss),
                      "cached": float(cached)},
        "python_rng": random.getstate(),
        "buffers": {name: buffer.detach().cpu().clone() for name, buffer in model.named_buffers()},
        "sync": method_state,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    return state


def restore_rank_state(state: dict | None, model: nn.Module, method: SyncMethod | None) -> None:
    """Put back what capture_rank_state took; called right before the first resumed batch. `method` takes back its
    state when it is the one that wrote it (None: another method, which starts afresh). No state: a rank the
    checkpoint's job did not have (--reshard), which keeps its own."""
    if state is None:
        return
    torch.set_rng_state(state["torch_rng"])
    numpy_rng = state["numpy_rng"]
    np.random.set_state((numpy_rng["kind"], np.array(numpy_rng["keys"], dtype=np.uint32), numpy_rng["pos"],
                         numpy_rng["has_gauss"], numpy_rng["cached"]))
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng"])
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, value in state["buffers"].items():
            buffers[name].copy_(value)
    if method is not None:
        method.load(model, None, {"method": state.get("sync")})


# ---------------------------------------------------------------------------------------------
# Writing: every rank contributes its state, rank 0 writes.

def save_atomically(payload: dict, target: Path) -> None:
    """torch.save to a temporary file beside `target`, renamed over it once complete (see files.write_atomically)."""
    write_atomically(target, lambda handle: torch.save(payload, handle))


class Checkpointer:
    """Saves a checkpoint every `--checkpoint-every` steps and at the end; a no-op without --checkpoint-dir."""

    def __init__(self, config: TrainConfig, cluster: Cluster, precision: str | None = None):
        # the folder was checked and claimed for this job before any work (reporter.check_outputs); `precision`:
        # --precision as it runs (auto resolved)
        self.config, self.cluster, self.precision = config, cluster, precision
        self.folder = Path(config.checkpoint_dir) if config.checkpoint_dir else None

    def due(self, step: int, total_steps: int) -> bool:
        """Every --checkpoint-every steps, and the last step; the last step's is written only after the final
        evaluation (train.run writes it once scored), so a job whose final checkpoint exists has nothing left to do."""
        every = self.config.checkpoint_every
        return self.folder is not None and (step == total_steps or bool(every and step % every == 0))

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, method: SyncMethod, position: Position,
             run_id: str | None, unsent_metrics: list[tuple] = (), loss_scaler: dict | None = None) -> None:
        """Collective: gather every rank's state, rank 0 writes; a failed write stops every rank together."""
        self.write(self.capture(model, optimizer, method, position, run_id, unsent_metrics, loss_scaler), position.step)

    def capture(self, model: nn.Module, optimizer: torch.optim.Optimizer, method: SyncMethod, position: Position,
                run_id: str | None, unsent_metrics: list[tuple] = (), loss_scaler: dict | None = None) -> dict | None:
        """Collective: the checkpoint as of now, on rank 0 (None elsewhere). Taken at the step boundary, where
        an uninterrupted job's random states stand, even when written later. `unsent_metrics`: what the tracker
        holds for this checkpoint (tracker.unsent), sent again by an attempt that resumes from it. `loss_scaler`:
        16-mixed's scaler state (step/gradients.py), the same on every rank."""
        # collective: a method that shards them gathers the model and optimizer, in the layout of an unsharded model
        # and optimizer, so that any method resumes from them, on any number of ranks (--reshard)
        saved = method.save(model, optimizer)
        rank_states = self.cluster.gather(capture_rank_state(model, saved["method"]))
        if not self.cluster.info.is_main:
            return None
        return checkpoint_payload(self.config, self.cluster.info.world_size, position, saved["model"],
                                  saved["optimizer"], rank_states, run_id, unsent_metrics, loss_scaler, self.precision)

    def write(self, payload: dict | None, step: int) -> None:
        """Collective: rank 0 writes what `capture` took and prunes the oldest; every rank learns the outcome."""
        outcome = write_checkpoint(payload, self.folder, step) if self.cluster.info.is_main else None
        self.cluster.agree(outcome, f"checkpoint at step {step}")


def checkpoint_payload(config: TrainConfig, world_size: int, position: Position, model_state: dict,
                       optimizer_state: dict, rank_states: list[dict], run_id: str | None,
                       unsent_metrics: list[tuple] = (), loss_scaler: dict | None = None,
                       precision: str | None = None) -> dict:
    """What a checkpoint file holds: the job's identity (what check_compatible compares), its position and states."""
    return {
        "format": FORMAT_VERSION, "model": config.model_name, "dataset": config.dataset,
        "train_size": config.synthetic_samples if config.dataset == "synthetic" else None,
        "model_shape": model_shape(config),
        "world_size": world_size, "batch_size": config.batch_size, "sync": config.sync,
        "compression": config.compression, "seed": config.seed, "optimizer": config.optimizer_settings.optimizer,
        "precision": precision,
        "epoch": position.epoch, "step": position.step, "step_in_epoch": position.step_in_epoch,
        "elapsed_s": position.elapsed_s, "sent_bytes": position.sent_bytes,
        "model_state": model_state, "optimizer_state": copy.deepcopy(optimizer_state), "ranks": rank_states,
        "mlflow_parent_run_id": run_id, "unsent_metrics": list(unsent_metrics), "loss_scaler": loss_scaler,
    }


def write_checkpoint(payload: dict, folder: Path, step: int) -> str | None:
    """Write step `step`'s checkpoint into `folder` and delete the oldest: None, or why the system refused.

    torch.save reports a full disk as its own RuntimeError chained from the system's OSError, so a failure is told
    by the system error behind it whatever its type; a failure with none behind it is a bug, and raised."""
    target = folder / checkpoint_name(step)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        save_atomically(payload, target)
    except Exception as error:
        cause = system_error(error)
        if cause is None:
            raise
        fix = "Free space" if cause.errno in (errno.ENOSPC, errno.EDQUOT) else f"Make {folder} writable"
        try:  # what is there now: the folder may have been emptied or taken away while the job ran
            kept = list_checkpoints(folder)
        except OSError:
            kept = []
        then = (f"the previous checkpoints in {folder} are intact. {fix} or choose another --checkpoint-dir, then "
                f"relaunch with --resume {folder} to continue from the latest ({kept[-1].name})." if kept else
                f"{folder} holds no earlier checkpoint. {fix} or choose another --checkpoint-dir, then relaunch.")
        return f"writing {target} failed ({cause.strerror or cause}); nothing of it is left and {then}"
    for old in list_checkpoints(folder)[:-KEEP_LAST]:
        try:
            old.unlink(missing_ok=True)
        except OSError as error:
            return (f"deleting the old checkpoint {old} failed ({error.strerror or error}) after {target} was "
                    f"written. Make {folder} writable, then relaunch with --resume {folder} to continue.")
    return None


# ---------------------------------------------------------------------------------------------
# Resuming: rank 0 reads and checks, every rank gets its part.

@dataclass
class Resume:
    """What a resumed job restores; `rank_state` is this rank's own."""

    path: Path
    position: Position
    model_state: dict
    optimizer_state: dict
    rank_state: dict
    parent_run_id: str | None
    method: str  # the sync method's label that wrote it: its state is taken back by the same method only
    world_size: int  # the ranks that wrote it (another number than this job's only under --reshard)
    unsent_metrics: list  # on rank 0: what the attempt that wrote it may not have sent (tracker.resend)
    loss_scaler: dict | None = None  # 16-mixed's scaler state, if the job that wrote it had one
    written_with: dict | None = None  # the precision (None before it was kept), seed, sync and compression it ran

    def resharded(self, world_size: int) -> bool:
        """Written by another number of ranks: each rank's sync method state (compression residuals, a share of
        the gradients it no longer holds) starts afresh."""
        return self.world_size != world_size

    def finished(self, total_steps: int) -> bool:
        """The checkpoint of a job's end (--resume auto relaunched a job that had finished): nothing to do."""
        return self.position.step >= total_steps


def find_checkpoint(spec: str, checkpoint_dir: str | None = None) -> Path | None:
    """--resume's argument: a checkpoint file, or a folder whose latest checkpoint is taken; `auto`, the latest under
    --checkpoint-dir, or None when it holds none yet (a fresh start)."""
    if spec == RESUME_AUTO:
        found = list_checkpoints(Path(checkpoint_dir))
        return found[-1] if found else None
    path = Path(spec)
    if path.is_dir():
        found = list_checkpoints(path)
        if not found:
            raise UserError(f"--resume {spec}: the folder holds no checkpoint (files named step-NNNNNNNN.pt). "
                            f"Name a checkpoint file or the --checkpoint-dir of an earlier job, or drop --resume.")
        return found[-1]
    if not path.is_file():
        raise UserError(f"--resume {spec}: no such file or folder. Name a checkpoint file (step-NNNNNNNN.pt) "
                        f"or the --checkpoint-dir of an earlier job.")
    return path


class Damaged(Exception):
    """A checkpoint file that does not read back whole; the message says how it is broken."""


def archive_damage(path: Path) -> str | None:
    """How `path` falls short of a whole torch.save archive, or None: every part is checked against the checksum
    torch.save wrote for it, since torch.load checks none and reads overwritten bytes of a tensor as its values."""
    try:
        with zipfile.ZipFile(path) as archive:
            broken = archive.testzip()
    except zipfile.BadZipFile:
        return "cut short, or not a file torch.save wrote"
    except OSError as error:
        return f"reading it failed: {error.strerror or error}"
    except Exception as error:  # noqa: BLE001 - a garbled index of parts fails in many ways: one message
        return f"its index of parts is garbled ({type(error).__name__})"
    return f"its part {broken} does not match its checksum: bytes were overwritten" if broken else None


def load_whole(path: Path) -> object:
    """torch.load of `path` once its archive is whole; raises Damaged."""
    damage = archive_damage(path)
    if damage:
        raise Damaged(damage)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - whole, but not what a checkpoint holds: one message
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise Damaged(f"{type(error).__name__}: {first_line}") from None


def check_format(payload: object, path: Path) -> dict:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise UserError(f"--resume {path} is not a checkpoint this version can read (format "
                        f"{payload.get('format') if isinstance(payload, dict) else 'unknown'}, expected "
                        f"{FORMAT_VERSION}). Name a checkpoint written by this version, or drop --resume.")
    held = len(payload.get("ranks") or ())
    if held != payload.get("world_size"):  # each rank's random state and place in the data: one missing cannot resume
        raise UserError(f"--resume {path} was written by {payload.get('world_size')} ranks but holds the state of "
                        f"{held}: it was changed after it was written. {newest_intact_advice(path)}")
    return payload


def read_checkpoint(path: Path) -> dict:
    """The checkpoint in `path`; a damaged one is refused naming the newest intact checkpoint beside it."""
    try:
        payload = load_whole(path)
    except Damaged as damage:
        raise UserError(f"--resume {path} could not be read as a checkpoint ({damage}). It is damaged or not a "
                        f"checkpoint of this program. {newest_intact_advice(path)}") from None
    return check_format(payload, path)


def newest_intact_advice(damaged: Path) -> str:
    """Where to go on from instead of `damaged`: the newest checkpoint beside it whose parts all check out."""
    folder = damaged.parent
    for path in reversed(list_checkpoints(folder)):
        if path == damaged or archive_damage(path):
            continue
        return (f"The newest intact checkpoint in {folder} is {path} (step {checkpoint_step(path)}): relaunch with "
                f"--resume {path} to continue from it, or drop --resume to start afresh.")
    return f"No other checkpoint in {folder} is intact: drop --resume to start afresh."


def read_newest_intact(folder: Path) -> tuple[Path, dict, list[tuple[Path, str]]]:
    """Under --resume auto: the newest checkpoint in `folder` that reads back whole, and the damaged ones newer than
    it, each with how it is broken. Every one damaged: refused."""
    damaged = []
    for path in reversed(list_checkpoints(folder)):
        try:
            payload = load_whole(path)
        except Damaged as damage:
            damaged.append((path, str(damage)))
            continue
        return path, check_format(payload, path), damaged
    raise UserError(f"--resume auto: every checkpoint in {folder} is damaged ("
                    + "; ".join(f"{path.name}: {why}" for path, why in damaged)
                    + f"), so there is nothing to continue from. To start afresh, move them out of {folder} (or "
                      f"choose another --checkpoint-dir) and relaunch; --resume auto then starts from step 0.")


def set_aside(damaged: list[tuple[Path, str]], used: Path) -> str:
    """Rename the damaged checkpoints out of NAME_PATTERN (kept for a look, never picked again); the line that
    says so."""
    for path, _ in damaged:
        try:
            os.replace(path, path.with_name(path.name + DAMAGED_SUFFIX))
        except OSError as error:
            raise UserError(f"--resume auto: {path} is damaged, and renaming it aside failed "
                            f"({error.strerror or error}). Move it out of {path.parent}, then relaunch.") from None
    named = " and ".join(f"{path} ({why})" for path, why in damaged)
    kept = ", ".join(path.name + DAMAGED_SUFFIX for path, _ in damaged)
    first, last = checkpoint_step(used) + 1, checkpoint_step(damaged[0][0])
    return (f"mpi_train: --resume auto: {named} {'is' if len(damaged) == 1 else 'are'} damaged (set aside as "
            f"{kept}); resuming from {used} (step {checkpoint_step(used)}), so step"
            + (f" {first} is" if first == last else f"s {first} to {last} are") + " trained again.")


def optimizer_of(payload: dict) -> str | None:
    """The optimizer whose state the checkpoint holds: the name it records, else told by that state (None when it
    cannot be told)."""
    return payload.get("optimizer") or told_by_state(payload.get("optimizer_state") or {})


def check_compatible(payload: dict, path: Path, config: TrainConfig, world_size: int, total_steps: int,
                     shapes: dict[str, tuple] | None = None) -> None:
    """The checkpoint must come from the same model (given `shapes`, its state tensors' shapes: with the same
    shapes), optimizer, ranks, global batch and data, and leave steps to do (under --resume auto, a checkpoint of the
    last step is a job that finished: see Resume.finished). The optimizer is compared as the job resolved it: its
    default depends on the model, so leaving out a flag can change it."""
    train_size = config.synthetic_samples if config.dataset == "synthetic" else None
    optimizer = config.optimizer_settings.optimizer
    shaped = payload.get("model_shape")
    held = {"model": payload["model"], "optimizer": optimizer_of(payload), "ranks": payload["world_size"],
            "global batch": payload["batch_size"], "data set": payload["dataset"],
            "training samples": payload.get("train_size"), "shape": shape_words(shaped)}
    asked = {"model": config.model_name, "optimizer": optimizer, "ranks": world_size,
             "global batch": config.batch_size, "data set": config.dataset, "training samples": train_size,
             "shape": shape_words(model_shape(config)) if shaped else ""}
    # allowed, or cannot be told (a checkpoint from before shapes were kept: its tensors' shapes tell, below)
    skipped = {"ranks": config.reshard, "optimizer": held["optimizer"] is None,
               "shape": held["model"] != asked["model"]}
    differing = [key for key in held if held[key] != asked[key] and not skipped.get(key)]
    # under --reshard the global batch stays the checkpoint's, so where it does not split across these ranks, the fix
    # names rank counts it splits across
    ranks = ranks_advice(held["global batch"], world_size, config.accumulate) if config.reshard else None
    if differing:
        fixes = {"model": f"--model {held['model']}", "optimizer": f"--optimizer {held['optimizer']}",
                 "ranks": f"mpirun -np {held['ranks']}",
                 "global batch": f"--batch-size {held['global batch']}" + (f" on {ranks}" if ranks else ""),
                 "data set": f"--dataset {held['data set']}",
                 "training samples": f"--synthetic-size {held['training samples']}",
                 "shape": shape_flags(shaped) if shaped else ""}
        default = "" if config.optimizer else f" (the default for {config.model_name})"
        shown = {**asked, "optimizer": f"{optimizer}{default}"}
        raise UserError(
            f"--resume {path} holds step {payload['step']} of a job with "
            + ", ".join(f"{key} {held[key]}" for key in differing)
            + ", but this job has " + ", ".join(f"{key} {shown[key]}" for key in differing)
            + ". A checkpoint stores each rank's random state, its place in the data and the optimizer's state, so "
              "it continues only the same model (and its shape) and optimizer on the same number of ranks with the "
              "same global batch and data. Relaunch with "
            + " and ".join(fixes[key] for key in differing)
            + f", or drop --resume{' and --reshard' if config.reshard else ''} to start afresh."
            + (" (--reshard continues it on another number of ranks.)" if differing == ["ranks"] else "")
        )
    unfit = unfit_weights(payload["model_state"], shapes, f"--resume {path} holds step {payload['step']} of a "
                          f"{payload['model']}") if shapes is not None else None
    if unfit:
        raise UserError(unfit)
    if payload["step"] >= total_steps and config.resume != RESUME_AUTO:
        raise UserError(f"--resume {path} is at step {payload['step']}, and this job trains {total_steps} steps in "
                        f"all, so nothing is left to do. Raise --max-steps or --epochs to train further.")


def load_for_resume(config: TrainConfig, cluster: Cluster, total_steps: int,
                    model: nn.Module | None = None) -> Resume | None:
    """Collective: rank 0 finds, reads and checks --resume (against `model`'s state tensors' shapes); each rank
    receives the shared part and its own."""
    if not config.resume:
        if cluster.info.is_main and config.checkpoint_dir and (found := list_checkpoints(Path(config.checkpoint_dir))):
            print(f"mpi_train: warning: --checkpoint-dir {config.checkpoint_dir} holds {len(found)} checkpoint(s) this "
                  f"job did not write (the newest {found[-1].name}), and it starts afresh: its own will lie among "
                  f"them, and --resume auto would go on from the newest of either. Give each job a --checkpoint-dir "
                  f"of its own, or pass --resume auto to continue them.", file=sys.stderr, flush=True)
        return None
    payload, outcome, path = None, None, None
    if cluster.info.is_main:
        shapes = {name: tuple(value.shape) for name, value in model.state_dict().items()} if model else None
        try:
            path = find_checkpoint(config.resume, config.checkpoint_dir)
            if path is not None and config.resume == RESUME_AUTO:  # damaged ones give way to the newest intact
                path, payload, damaged = read_newest_intact(path.parent)
                check_compatible(payload, path, config, cluster.info.world_size, total_steps, shapes)
                if damaged:
                    print(set_aside(damaged, path), flush=True)
            elif path is not None:
                payload = read_checkpoint(path)
                check_compatible(payload, path, config, cluster.info.world_size, total_steps, shapes)
        except UserError as error:
            outcome = str(error)
    cluster.agree(outcome, "cannot resume")
    # --resume auto with no checkpoint yet: a fresh start
    found = cluster.bcast(path is not None)
    if not found:
        return None
    shared = None
    if cluster.info.is_main:
        shared = {key: payload[key] for key in ("epoch", "step", "step_in_epoch", "model_state", "optimizer_state",
                                                "mlflow_parent_run_id")}
        shared.update({key: payload.get(key, 0.0) for key in ("elapsed_s", "sent_bytes")})
        shared["path"] = str(path)
        shared["method"] = label(payload["sync"], payload.get("compression", "none"))
        shared["world_size"] = payload["world_size"]
        shared["loss_scaler"] = payload.get("loss_scaler")
        shared["written_with"] = {key: payload.get(key) for key in ("precision", "seed", "sync", "compression")}
    shared = cluster.bcast(shared)
    unsent = payload.get("unsent_metrics", []) if cluster.info.is_main else []
    # under --reshard, ranks the checkpoint had take theirs back; the others keep the fresh state they started with
    ranks = payload["ranks"] if payload else None
    if ranks is not None:
        ranks = [ranks[rank] if rank < len(ranks) else None for rank in range(cluster.info.world_size)]
    rank_state = cluster.scatter(ranks)
    return Resume(path=Path(shared["path"]),
                  position=Position(epoch=shared["epoch"], step=shared["step"],
                                    step_in_epoch=shared["step_in_epoch"], elapsed_s=shared["elapsed_s"],
                                    sent_bytes=shared["sent_bytes"]),
                  model_state=shared["model_state"], optimizer_state=shared["optimizer_state"],
                  rank_state=rank_state, parent_run_id=shared["mlflow_parent_run_id"], method=shared["method"],
                  world_size=shared["world_size"], unsent_metrics=unsent, loss_scaler=shared["loss_scaler"],
                  written_with=shared["written_with"])
