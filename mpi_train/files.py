"""Files written whole or not at all: a reader never sees half a file, a crash leaves the previous version; and
folders written by one job at a time."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import math
import os
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import folder_write_error, system_error

CLAIM_FILE = ".mpi_train.lock"
# File systems whose locks the kernel holds for the processes on this machine alone: a lock is released the moment
# its process dies. A network file system's lock outlives a host that died by its lease (90 s on NFSv4), which would
# refuse the relaunch that replaces that host; there, and on any file system not named here, nothing is claimed.
LOCAL_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "zfs", "overlay", "f2fs", "bcachefs",
                                "ramfs", "jfs", "reiserfs"})


def write_atomically(target: Path, write: Callable[[BinaryIO], None]) -> None:
    """`write` into a temporary file beside `target`, fsync, rename over it, fsync the folder: a reader never
    sees half a file, and a crash mid-write leaves the previous version intact (and no temporary file).

    A failure up to the rename (a full disk, in `write` or in the fsync; a rename refused) removes the temporary
    file, leaves `target` as it was and raises the failure itself, even if removing the file fails as well. A
    failure of the folder's fsync is raised too: `target` is then whole, but may not survive a power cut.

    A process killed mid-write (mpirun ends the ranks of a job stopped with Ctrl-C) cannot remove its temporary file:
    the next write of `target` on the same host removes those of processes no longer running."""
    remove_dead_partials(target)
    partial = target.with_name(partial_name(target.name, os.getpid()))
    try:
        with open(partial, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):  # the write's own failure is the one to report
            partial.unlink(missing_ok=True)
        raise
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power cut
    finally:
        os.close(folder)


def write_error(path: Path, folder: bool) -> str | None:
    """Why `path` (a file, or a folder when `folder`) could not be written, as what follows its name, or None.
    Creates nothing, so that a job refused here leaves no empty folder behind: the nearest folder that exists must
    take a file."""
    try:
        if path.exists() and path.is_dir() != folder:
            return "is a folder, not a file" if path.is_dir() else "is a file, not a folder"
        nearest = path.absolute() if folder else path.absolute().parent
        while not nearest.exists() and nearest != nearest.parent:
            nearest = nearest.parent
        if not nearest.is_dir():
            return f"lies under {nearest}, which is a file"
    except OSError as error:
        return f"cannot be reached ({error.strerror or error})"
    reason = folder_write_error(nearest)
    return f"cannot be written: {nearest} takes no file ({reason})" if reason else None


def unwritable(outputs: Sequence[tuple[str, str | None, bool]]) -> str | None:
    """Why each of `outputs` named (flag, path or None, a folder?) could not be written, a sentence each, or None.
    Creates nothing."""
    return " ".join(f"{flag} {path or repr(path)} {reason}; name a {'folder' if folder else 'file in a folder'} this "
                    f"user can write." for flag, path, folder in outputs
                    if path is not None and (reason := named_error(path, folder))) or None


def named_error(path: str, folder: bool) -> str | None:
    """write_error, and before it what the name itself rules out: nothing at all, or a file's name that ends in /
    (a folder's, which Path would drop, writing a file of the folder's name)."""
    if not path:
        return "names nothing"
    if not folder and path.endswith(("/", os.sep)):
        return "ends in /, as a folder's name does, not a file's"
    return write_error(Path(path), folder)


def kept(what: str, write) -> str | None:
    """None if `write()` kept `what`, else why not, in words that follow its name (a disk that filled while the
    command worked: what it printed, and its other outputs, still hold the results)."""
    try:
        write()
    except OSError as error:
        return f"{what} could not be written ({error.strerror or error})"
    except RuntimeError as error:  # a library's wrapper (matplotlib, torch) around the system's refusal
        if (cause := system_error(error)) is None:
            raise
        return f"{what} could not be written ({cause.strerror or cause})"
    return None


def partial_name(name: str, pid: int) -> str:
    """The temporary name a write of `name` by process `pid` goes under, with its host: the folder may be shared, and
    a pid tells only of its own host's processes."""
    return f".{name}.{socket.gethostname()}-{pid}.partial"


def remove_dead_partials(target: Path) -> None:
    """Remove the temporary files (or folders) of writes of `target` by processes of this host that are no longer
    running."""
    prefix = f".{target.name}.{socket.gethostname()}-"
    with contextlib.suppress(OSError):
        for left in target.parent.glob(f"{glob.escape(prefix)}*.partial"):
            pid = left.name[len(prefix):-len(".partial")]
            if pid.isdigit() and not running(int(pid)):
                if left.is_dir():
                    shutil.rmtree(left, ignore_errors=True)
                else:
                    left.unlink(missing_ok=True)


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def write_json_atomically(path: str, payload: dict | list) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, lambda handle: handle.write((json.dumps(payload, indent=2) + "\n").encode()))


def without_nan(value):
    """`value` with every float that is not finite as None: JSON has no NaN or Infinity, and strict readers
    (JavaScript's JSON.parse, jq --strict) refuse the tokens Python writes for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_nan(item) for item in value]
    return value


def append_private(path: Path):
    """`path` opened for appending, created readable and writable by its owner only (spools: they hold a job's
    figures and the server's address), its folder too."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a")


def write_private(path: Path, text: str) -> None:
    """`text` into a new file only its owner can read (a password): never readable by others, not even briefly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        handle.write(text)


def write_figure(fig, path: Path, rect: tuple | None = None, **options) -> Path:
    """Lay a matplotlib figure out (inside `rect`, leaving room for a legend or title outside the axes), write it as
    a PNG whole or not at all (its folder made if missing; `options` to savefig) and close it. Its titles go into the
    PNG's Title too, so what a plot says on its face can be read without looking."""
    import matplotlib.pyplot as plt  # loaded only by the commands that draw

    try:
        fig.tight_layout(rect=rect)
        titles = [fig.get_suptitle(), *(ax.get_title() for ax in fig.axes if ax.get_visible())]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda handle: fig.savefig(
            handle, format="png", dpi=110, metadata={"Title": " | ".join(title for title in titles if title)},
            **options))
    finally:
        plt.close(fig)
    return path


@dataclass(frozen=True)
class _Claim:
    descriptor: int
    made: tuple[Path, ...]  # the folders the claim made, innermost first: removed again if the job left them empty


_claims: dict[Path, _Claim] = {}


def file_system(path: Path) -> str | None:
    """The type of the file system `path` lies on (or would, once made), from the kernel's mount table."""
    target = str(path.resolve())
    found, longest = None, -1
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            mount_point = fields[4].replace("\\040", " ")
            inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) > longest:
                found, longest = fields[fields.index("-") + 1], len(mount_point)
    return found


def claim_folder(folder: Path) -> str | None:
    """Claim `folder` for this process's job until `release_claims` or the process's end (a lock the kernel drops
    with the process, however it dies). None once claimed, or where no lock can tell (see LOCAL_FILE_SYSTEMS); else
    who holds it, as its holder wrote. A process holds its own claim again: the jobs it runs come one after another."""
    folder = folder.resolve()
    if folder in _claims or file_system(folder) not in LOCAL_FILE_SYSTEMS:
        return None
    made = tuple(above for above in (folder, *folder.parents) if not above.exists())
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(folder / CLAIM_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 1024, 0).decode(errors="replace").strip()
        os.close(descriptor)
        return holder or "a process that has not said which"
    except OSError:  # a file system that takes no lock after all
        os.close(descriptor)
        return None
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"process {os.getpid()} on host {socket.gethostname()}, since "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
    _claims[folder] = _Claim(descriptor, made)
    return None


def release_claims() -> None:
    """Let go of every folder this process claimed; one it made and left empty is removed, claim file and all."""
    for folder, claim in _claims.items():
        with contextlib.suppress(OSError):  # a folder the job wrote in stays
            if claim.made and [entry.name for entry in folder.iterdir()] == [CLAIM_FILE]:
                (folder / CLAIM_FILE).unlink()
                for made in claim.made:
                    made.rmdir()
        os.close(claim.descriptor)
    _claims.clear()
