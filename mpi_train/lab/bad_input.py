"""`python -m mpi_train soak --bad-input`: each fault a user can cause, as a real job, held to one standard.

Each case (bad_input_cases.py, bad_input_surroundings.py, bad_input_commands.py) runs in a fresh temporary folder,
as a user would from an empty one, two at a time. A case is `ok` when each run of it

  exits non-zero (a warning case: exits 0 and prints its warning),
  prints no line with "Traceback",
  names the cause (the case's patterns, matched against its output with line breaks as spaces),
  leaves nothing running (no process working in its folder or naming it, no daemon of its mpirun),
  leaves nothing half-written (no *.partial file, no empty folder it created, no checkpoint or
    data cache that cannot be read, but for those the case damaged on purpose),

within the case's timeout (a run past it is a hang), and passes the case's own check where it
has one. A row per case; exit status 0 when every case is ok, else 1. The cases' outputs are
kept in OUT/bad-input/, the table in OUT/bad-input.txt.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from . import bad_input_cases, bad_input_commands, bad_input_surroundings
from .bad_input_judge import STOP, Run, judge, launch, message
from .bad_input_workspace import Case, NotRunnable, Setups, Workspace

CASES = [*bad_input_cases.CASES, *bad_input_surroundings.CASES, *bad_input_commands.CASES]
# cases at a time: a job spends much of its start waiting (mpirun's launch, the rendezvous, the ranks' imports on a
# busy machine), so two of them keep this 2-core machine busier than one, and the probe inside 10 minutes
CONCURRENT = 2


@dataclass
class Row:
    """A case and how its runs fared."""

    case: str
    runs: list[Run] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    not_run: str = ""

    @property
    def verdict(self) -> str:
        if self.not_run:
            return "NOT RUN"
        return ", ".join(self.problems) or "ok"


def run_case(number: int, case: Case, root: Path, setups: Setups, out: Path) -> Row:
    folder, aside = root / f"{number:02d}-{case.name}", root / "aside" / f"{number:02d}"
    folder.mkdir()
    aside.mkdir(parents=True)
    row = Row(case.name)
    if STOP.is_set():
        row.not_run = "interrupted"
        return row
    with ExitStack() as stack:  # the tmpfs and the server go on every way out
        ws = Workspace(folder, aside, stack, setups)
        try:
            commands = case.prepare(ws)
        except (NotRunnable, OSError) as why:
            row.not_run = str(why)
            return row
        for command in commands:
            run = launch(command, folder, case.timeout_s, ws.damaged)
            row.runs.append(run)
            said = {"HALF-WRITTEN": f"HALF-WRITTEN ({', '.join(run.half_written)})",
                    "LEFT RUNNING": f"LEFT RUNNING ({len(run.left)} process(es))"}  # what, where the rule alone is not
            row.problems += [said.get(p, p) for p in judge(run, case.causes, case.warning) if said.get(p, p) not in
                             row.problems]
            if run.exit is None:
                break
        if case.check:
            row.problems += case.check(ws, row.runs)
    with open(out / f"{number:02d}-{case.name}.txt", "w") as log:
        for index, run in enumerate(row.runs, 1):
            log.write(f"$ run {index}: exit {run.exit}, {run.seconds:.1f} s\n{run.output}\n")
            log.writelines(f"left running: {line}\n" for line in run.left)
            log.writelines(f"half-written: {line}\n" for line in run.half_written)
    return row


COLUMNS = ("case", "exit", "s", "verdict", "message")


def format_table(rows: list[Row]) -> str:
    cells = []
    for row in rows:
        last = row.runs[-1] if row.runs else None
        said = row.not_run or (message(last.output)[:110] if last and row.verdict != "ok" else "")
        cells.append((row.case, "-" if last is None or last.exit is None else str(last.exit),
                      f"{sum(run.seconds for run in row.runs):.1f}", row.verdict, said))
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells])


def chosen(names: str | None) -> list[tuple[int, Case]]:
    """The cases --faults names (default: all), with their numbers."""
    numbered = list(enumerate(CASES, 1))
    if not names:
        return numbered
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in {case.name for case in CASES}]
    if unknown or not wanted:
        raise UserError(f"--faults {names!r} names {', '.join(unknown) or 'nothing'}, which is not a case of "
                        f"--bad-input; choose from {', '.join(case.name for case in CASES)}.")
    return [(number, case) for number, case in numbered if case.name in wanted]


def probe(args) -> int:
    """Run the cases --faults names (default: all) and print the table; 0 when every one is ok."""
    cases = chosen(args.faults)
    out = Path(args.out).resolve() / "bad-input"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    root = Path(tempfile.mkdtemp(prefix="bad-input-"))
    finished: dict[int, Row] = {}
    started = time.monotonic()
    STOP.clear()
    setups = Setups(root)
    pool = ThreadPoolExecutor(CONCURRENT)
    try:
        running = {pool.submit(run_case, number, case, root, setups, out): number for number, case in cases}
        print(f"bad-input: {len(cases)} case(s), {CONCURRENT} at a time, in {root}", flush=True)
        for done in as_completed(running):
            row = finished[running[done]] = done.result()
            last = row.runs[-1] if row.runs else None
            print(f"bad-input: {running[done]:02d} {row.case}: {row.verdict}"
                  + (f" ({row.not_run})" if row.not_run else "")
                  + (f", exit {last.exit}, {sum(run.seconds for run in row.runs):.1f} s" if last else ""), flush=True)
    except BaseException:
        STOP.set()  # each running case stops its launch and cleans up (tmpfs, server, leftovers) before we go
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(root, ignore_errors=True)
    rows = [finished[number] for number, _ in cases]
    ok = sum(row.verdict == "ok" for row in rows)
    text = format_table(rows) + f"\n\n{len(rows)} cases, {ok} ok, in {time.monotonic() - started:.0f} s"
    print("\n" + text)
    (out.parent / "bad-input.txt").write_text(text + "\n")
    print(f"bad-input: table in {out.parent / 'bad-input.txt'}, each case's output in {out}/")
    return 0 if ok == len(rows) else 1
