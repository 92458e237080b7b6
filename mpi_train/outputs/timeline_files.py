"""Under --timeline-dir: the job's trace (Chrome-trace JSON), its swimlane picture, and what both say per message."""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from pathlib import Path

from .. import swimlanes, timeline
from ..files import write_json_atomically


@dataclass(frozen=True)
class SavedTimeline:
    """The files written (the trace, then the picture), the summary's `timeline` part, and the console's lines."""

    files: tuple[Path, Path]
    part: dict
    lines: tuple[str, ...]


def against_model(wire: dict[str, float], predicted: dict[str, float]) -> str:
    """Each collective's measured seconds on the wire beside the model's (Prediction.parts), for the console; a
    message named for where it runs ("allreduce (DDP bucket)") is its collective's."""
    def collective(message: str) -> str:
        return message if message in predicted else message.split(" (")[0]

    def beside(name: str, seconds: float) -> str:
        model = predicted.get(collective(name))
        return f"{name} {seconds * 1e3:.1f} ms" + (
            f" (model {model * 1e3:.1f} ms, {(model / seconds - 1) * 100:+.0f}%)" if model and seconds else "")
    unmatched = [f"{name} {seconds * 1e3:.1f} ms" for name, seconds in predicted.items()
                 if name not in {collective(message) for message in wire}]
    return ", ".join(beside(name, seconds) for name, seconds in wire.items()) + (
        f"; the model: {', '.join(unmatched)}" if unmatched else "")


def predicted_plan(sync_model, recorder, method) -> dict | None:
    """What the alpha-beta model expects of rank 0's first kept step's messages, from when that step's gradients
    were ready (seconds from its backward's start), for the swimlanes; None without a model."""
    if sync_model is None or not recorder.kept:
        return None
    return swimlanes.predicted(recorder.kept[0], sync_model, method)


def claim_names(folder: Path, run: str) -> tuple[Path, Path]:
    """The trace and picture paths for `run`: `run`'s own, else `run-2`'s, `run-3`'s..., the first that no earlier
    job left (a rerun, or another model at the same method and seed, takes the default run name again). The trace is
    created empty at once, so that two jobs that end together cannot claim one name."""
    number = 1
    while True:
        stem = run if number == 1 else f"{run}-{number}"
        trace, picture = folder / f"{stem}.trace.json", folder / f"{stem}.swimlanes.png"
        number += 1
        if picture.exists():
            continue
        try:
            trace.open("x").close()
        except FileExistsError:
            continue
        return trace, picture


def save(folder: Path, about: dict, job: dict, per_rank_events: list | None, alignments, recorder, method,
         sync_model) -> SavedTimeline:
    """Writes the trace and the picture of `recorder`'s window into `folder`; `about` names the run in both. Where
    the system refuses (a disk that filled), neither is left behind, nor the folder if this made it."""
    document = timeline.trace(per_rank_events, job["hosts"], alignments, about)
    path = picture = None
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path, picture = claim_names(folder, about["run"])
        write_json_atomically(str(path), document)
        plan = predicted_plan(sync_model, recorder, method)
        swimlanes.draw(document, picture, plan)
    except OSError:
        for written in (path, picture) if path else ():
            with contextlib.suppress(OSError):
                written.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    wire = {name: statistics.fmean(steps) for name, steps in timeline.wire_per_step(document["traceEvents"]).items()}
    predicted = sync_model.prediction.parts if sync_model else {}
    part = {"steps": [recorder.kept[0].step, recorder.kept[-1].step] if recorder.kept else [],
            "trace": str(path), "messages": swimlanes.bucket_rows(recorder.kept, plan),
            "wire_s_per_step": wire, **({"predicted_wire_s_per_step": predicted} if predicted else {})}
    last = min(recorder.window[1], job["total_steps"])
    opened = (f"mpi_train: timeline of steps {recorder.window[0]}..{last}: {path} (open it in https://ui.perfetto.dev "
              f"or chrome://tracing), {picture}")
    lines = [opened]
    if wire:
        lines.append("mpi_train: on the wire per step (the timeline's steps, each message from the last rank's "
                     f"launch): {against_model(wire, predicted)}")
    return SavedTimeline(files=(path, picture), part=part, lines=tuple(lines))
