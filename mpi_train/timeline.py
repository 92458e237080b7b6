"""Where every step's time goes on every rank: phases, gradients and messages, on clocks aligned across hosts.

Always on: each rank notes, per step, when it arrived at the sync (after backward; for a method that
communicates during backward, when its last gradient was ready) on a clock aligned with rank 0's, how
long its sync region lasted (from that arrival to the end of its sync call), and for such a method
each message's start and end. At a logged step rank 0 compares the ranks' arrivals (split()): what
a rank spent waiting for the last rank to arrive is `sync_wait_s`, the rest of the region
`sync_transfer_s`; the region is `exposed_comm_s`, the communication compute did not hide, and
`comm_overlap` is the share of message time that ran during backward (Holistic Trace Analysis's
definition). A per-rank sync time alone counts the other ranks' lateness as this rank's cost.

With --timeline, the steps of --timeline-steps also keep every phase, each gradient's ready time and
every message (a compressor's own CPU work as its own interval): trace_events() turns them into a
Chrome-trace / Perfetto JSON, one process per rank, one track per kind.

Clocks: perf_counter on each rank, shifted by its offset to rank 0's, measured at start by a ping-pong
as NTP does: of K round trips, the fastest gives offset = ((t1 - t0) + (t2 - t3)) / 2, wrong by at
most half that round trip, which is recorded as the alignment's error bound.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

ALIGN_ROUNDS = 8
ALL_STEPS = 10**12  # the end of a window that runs to the last step
TRACKS = {"phases": 1, "gradients": 2, "messages": 3, "codec": 4}  # Chrome-trace thread ids, one track per kind
PHASE_NAMES = ("data", "forward", "backward", "sync", "optimizer", "average")  # average: model averaging's sync


def now() -> float:
    return time.perf_counter()


# ---------------------------------------------------------------------------------------------
# Clock alignment (collective).

@dataclass(frozen=True)
class Alignment:
    """This rank's clock offset to rank 0's (subtract it), and the bound on its error; rank 0's own is 0."""

    offset_s: float = 0.0
    error_s: float = 0.0


def offset_from(rounds: list[tuple[float, float, float, float]]) -> Alignment:
    """NTP's estimate from (t0, t1, t2, t3) round trips: t0, t3 on the origin's clock, t1, t2 on the peer's; the
    fastest round trip gives the offset of the peer's clock and half of it bounds the error."""
    t0, t1, t2, t3 = min(rounds, key=lambda r: (r[3] - r[0]) - (r[2] - r[1]))
    return Alignment(((t1 - t0) + (t2 - t3)) / 2, ((t3 - t0) - (t2 - t1)) / 2)


def align_clocks(cluster, device) -> tuple[Alignment, list[Alignment] | None]:
    """Every rank's offset to rank 0's clock, by ping-pong with rank 0 in turn; this rank's, and all on rank 0.
    Collective: the process group must be open."""
    import torch
    import torch.distributed as dist

    rank, world = cluster.info.rank, cluster.info.world_size
    found = [Alignment()] * world
    buffer = torch.zeros(2, dtype=torch.float64, device=device)
    for peer in range(1, world):
        rounds = []
        for _ in range(ALIGN_ROUNDS + 1):  # the first round opens the connection: left out
            if rank == 0:
                t0 = now()
                buffer[0] = t0
                dist.send(buffer, dst=peer)
                dist.recv(buffer, src=peer)
                t3 = now()
                rounds.append((t0, float(buffer[0]), float(buffer[1]), t3))
            elif rank == peer:
                dist.recv(buffer, src=0)
                buffer[0] = now()
                buffer[1] = now()
                dist.send(buffer, dst=0)
        if rank == 0:
            found[peer] = offset_from(rounds[1:])
    mine = cluster.scatter([(a.offset_s, a.error_s) for a in found] if rank == 0 else None)
    return Alignment(*mine), found if rank == 0 else None


# ---------------------------------------------------------------------------------------------
# What a sync method reports as it sends.

@dataclass
class Message:
    """One message of a sync method: a collective, a send/recv pair or a compressor's own work (kind "codec")."""

    name: str
    start: float
    end: float | None = None
    nbytes: float = 0.0
    bucket: int | None = None
    kind: str = "message"


class Recorder:
    """What a sync method tells about its messages. This one records nothing: the default of every method, and
    what a rank holds when no figure needs the messages (a method that syncs after backward, outside a timeline)."""

    detailed = False  # every message, gradient and codec interval: a step of the timeline
    wants_messages = False  # the messages' start and end at least: detailed, or a method that overlaps backward

    def message(self, name: str, start: float, end: float | None = None, nbytes: float = 0.0,
                bucket: int | None = None) -> Message | None:
        return None

    def ended(self, message: Message | None) -> None:
        """An asynchronous message has completed (called from the thread that completed it)."""

    def after(self, message: Message | None, future):
        """Note `message`'s end when `future` completes; returns the future to wait on (or `future` itself)."""
        return future

    def codec(self, start: float, end: float, bucket: int | None = None) -> None: ...

    def background(self, name: str, start: float, end: float, nbytes: float = 0.0) -> None:
        """A message that ran in the background (an overlapped model average) from `start` to `end`, noted when the
        step that waited for it took it: drawn in the timeline, left out of the step's exposed communication."""

    def gradient(self, index: int) -> None: ...


NO_RECORDER = Recorder()


def timed(recorder: Recorder, name: str, nbytes: float, call, *args, bucket: int | None = None, **kwargs):
    """`call(*args, **kwargs)`, a blocking collective, noted as a message when the recorder wants messages."""
    if not recorder.wants_messages:
        return call(*args, **kwargs)
    start = now()
    result = call(*args, **kwargs)
    recorder.message(name, start, now(), nbytes, bucket)
    return result


def coded(recorder: Recorder, call, *args, bucket: int | None = None):
    """`call(*args)`, a compressor's own work (a cast, PowerSGD's products), noted as a codec interval when the
    recorder wants them (a timeline's step, the bench's codec clock)."""
    if not recorder.detailed:
        return call(*args)
    start = now()
    result = call(*args)
    recorder.codec(start, now(), bucket)
    return result


# ---------------------------------------------------------------------------------------------
# A rank's record of its steps.

@dataclass
class Step:
    """One step on one rank, on this rank's clock: its phases' boundaries, gradients and messages."""

    step: int
    # data start, forward start, backward start, sync start, optimizer start, its end (and a model average's end)
    bounds: tuple[float, ...] = ()
    sync: tuple[float, float] | None = None  # the sync region's start and end: bounds[3:5] unless said otherwise
    last_ready: float | None = None
    gradients: list = field(default_factory=list)  # (tensor index, ready time), detailed steps only
    messages: list = field(default_factory=list)


class StepRecorder(Recorder):
    """A rank's recorder: the figures every step owes (arrival, sync region, message time in and out of backward)
    and, for the steps of a timeline window, everything, kept for the trace."""

    def __init__(self, alignment: Alignment, overlapped: bool, window: tuple[int, int] | None = None,
                 gpu: bool = False):
        self.alignment, self.overlapped, self.window = alignment, overlapped, window
        # On a GPU a hook's clock says when backward queued a gradient, not when the GPU made it, and 34 Python hooks
        # cost the host about 1 ms of a 5 ms step (VGG-11, H200): there the step's arrival is its backward's end
        # mark, and gradients are noted only for a timeline.
        self.gpu = gpu
        self.current = Step(0)
        self.figures: list[dict] = []  # each step's since the last logged one
        self.kept: list[Step] = []  # the timeline window's steps
        self.lock = threading.Lock()
        self.busy_s = 0.0  # time spent here: the timeline's own overhead

    def watch(self, model) -> None:
        """Note when each gradient is ready in backward (hooks on the parameters), where a figure needs it."""
        if not (self.window or (self.overlapped and not self.gpu)):
            return
        for index, param in enumerate(p for p in model.parameters() if p.requires_grad):
            param.register_post_accumulate_grad_hook(lambda _p, index=index: self.gradient(index))

    def in_window(self, step: int) -> bool:
        """A step of the timeline (--timeline-steps): noted in full and kept for the trace."""
        return bool(self.window and self.window[0] <= step <= self.window[1])

    def begin(self, step: int) -> None:
        self.current = Step(step)
        self.detailed = self.in_window(step)
        self.wants_messages = self.detailed or self.overlapped

    def gradient(self, index: int) -> None:
        at = now()
        if not self.gpu:
            self.current.last_ready = at
        if self.detailed:
            self.current.gradients.append((index, at))

    def message(self, name, start, end=None, nbytes=0.0, bucket=None):
        if not self.wants_messages:
            return None
        message = Message(name=name, start=start, end=end, nbytes=nbytes, bucket=bucket)
        with self.lock:
            self.current.messages.append(message)
        return message

    def ended(self, message):
        if message is not None:
            message.end = now()

    def after(self, message, future):
        if message is None:
            return future
        return future.then(lambda done: (self.ended(message), done.value())[1])

    def codec(self, start, end, bucket=None):
        if self.detailed:
            with self.lock:
                self.current.messages.append(Message("codec", start, end, bucket=bucket, kind="codec"))

    def background(self, name, start, end, nbytes=0.0):
        if self.detailed:
            with self.lock:
                self.current.messages.append(Message(name, start, end, nbytes, kind="background"))

    def end(self, bounds: tuple[float, ...], sync: tuple[float, float] | None = None,
            step: Step | None = None) -> None:
        """The step is over: `bounds` are its phase boundaries (data, forward, backward, sync, optimizer, end, and
        the end of a model average after the optimizer; the forward/backward boundary only in detailed steps, else
        repeated); `sync` the sync region, when not bounds[3:5] (a model average's). `step`: the step they are of,
        when the clock read them after the next began (on a GPU); else the current one."""
        started = now()
        step = step or self.current
        step.bounds, step.sync = bounds, sync
        sync_start, sync_end = sync or bounds[3:5]
        arrival = step.last_ready if self.overlapped and step.last_ready else sync_start
        with self.lock:
            done = [m for m in step.messages if m.kind == "message"]
        comm = in_backward = 0.0
        for message in done:
            # counted up to the sync's end: one still in flight (zero's all-gathers, for the next forward) is the
            # next step's compute, done or not by the time this is read
            end = sync_end if message.end is None else min(message.end, sync_end)
            comm += end - message.start
            in_backward += max(0.0, min(end, arrival) - max(message.start, bounds[1]))
        self.figures.append({"step": step.step, "arrival": arrival - self.alignment.offset_s,
                             "region": sync_end - arrival, "sync": sync_end - sync_start, "comm": comm,
                             "in_backward": in_backward if self.overlapped else 0.0})
        if self.in_window(step.step):
            self.kept.append(step)
        self.busy_s += now() - started

    def take(self) -> list[dict]:
        """The steps' figures since the last call, for the logged step's gather."""
        figures, self.figures = self.figures, []
        return figures


def split(per_rank: list[list[dict]]) -> list[list[dict]]:
    """Each rank's steps split into waiting for the last rank and transfer, from every rank's arrivals (rank 0).

    The last rank to arrive waits for nobody; any other waits until it arrives, but never longer than its own
    sync region (it may have left for other work, such as buckets already done). exposed = wait + transfer = the
    region; overlap = the share of its message time that ran during backward."""
    result = [[] for _ in per_rank]
    for steps in zip(*per_rank):
        last = max(step["arrival"] for step in steps)
        slowest = max(range(len(steps)), key=lambda r: steps[r]["arrival"])
        for rank, step in enumerate(steps):
            wait = min(max(0.0, last - step["arrival"]), step["region"])
            result[rank].append({"step": step["step"], "sync_wait_s": wait, "sync_transfer_s": step["region"] - wait,
                                 "exposed_comm_s": step["region"], "comm_s": step["comm"],
                                 "comm_in_backward_s": step["in_backward"], "slowest_rank": slowest})
    return result


def means(steps: list[dict]) -> dict:
    """A rank's means over some of its split steps; comm_overlap over the total message time."""
    if not steps:
        return {}
    comm = sum(step["comm_s"] for step in steps)
    return {**{key: statistics.fmean(step[key] for step in steps)
               for key in ("sync_wait_s", "sync_transfer_s", "exposed_comm_s")},
            "comm_overlap": sum(step["comm_in_backward_s"] for step in steps) / comm if comm > 0 else 0.0}


def slowest(per_rank: list[list[dict]]) -> int | None:
    """The rank that arrived last at the sync in the most of these steps."""
    counts = Counter(step["slowest_rank"] for step in per_rank[0]) if per_rank and per_rank[0] else None
    return counts.most_common(1)[0][0] if counts else None


# ---------------------------------------------------------------------------------------------
# The trace a person opens.

def step_events(rank: int, steps: list[Step], offset_s: float, tensor_names: list[str]) -> list[dict]:
    """One rank's kept steps as Chrome-trace complete events ("X"; microseconds on rank 0's clock)."""
    def us(t: float) -> float:
        return round((t - offset_s) * 1e6, 1)

    events = []
    for step in steps:
        b = step.bounds
        for name, start, end in zip(PHASE_NAMES, b[:-1], b[1:]):
            if end > start:
                events.append({"name": name, "cat": "phase", "ph": "X", "pid": rank, "tid": TRACKS["phases"],
                               "ts": us(start), "dur": round((end - start) * 1e6, 1), "args": {"step": step.step}})
        for index, at in step.gradients:
            name = tensor_names[index] if index < len(tensor_names) else str(index)
            events.append({"name": f"grad {name}", "cat": "gradient", "ph": "i", "s": "t", "pid": rank,
                           "tid": TRACKS["gradients"], "ts": us(at), "args": {"step": step.step, "tensor": index}})
        for message in step.messages:
            end = message.end if message.end is not None else (step.sync or b[3:5])[1]
            track = TRACKS["codec"] if message.kind == "codec" else TRACKS["messages"]
            args = {"step": step.step, "bytes": message.nbytes}
            if message.bucket is not None:
                args["bucket"] = message.bucket
            events.append({"name": message.name, "cat": message.kind, "ph": "X", "pid": rank, "tid": track,
                           "ts": us(message.start), "dur": round(max(0.0, end - message.start) * 1e6, 1),
                           "args": args})
    return events


def trace(per_rank_events: list[list[dict]], hosts: list[str], alignment: list[Alignment], about: dict) -> dict:
    """The job's Chrome-trace JSON: a process per rank (named by rank and host), a named track per kind; where
    --compile costs the method its overlap (about's `overlap_lost_to_compile`), a mark across every track at the
    first kept step that says so, where the messages it explains are seen."""
    metadata = []
    for rank, host in enumerate(hosts):
        metadata.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank} ({host})"}})
        metadata.append({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        for track, tid in TRACKS.items():
            metadata.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": track}})
    events = [event for events in per_rank_events for event in events]
    if about.get("overlap_lost_to_compile") and events:
        first = min(events, key=lambda event: event["ts"])
        events.append({"name": f"compiled: {about['sync']}: {about['overlap_lost_to_compile']}", "cat": "compile",
                       "ph": "i", "s": "g", "pid": 0, "tid": TRACKS["messages"], "ts": first["ts"],
                       "args": {"step": first["args"]["step"]}})
    return {"traceEvents": metadata + sorted(events, key=lambda e: e["ts"]), "displayTimeUnit": "ms",
            "otherData": {**about, "clock_alignment": [{"rank": r, "offset_s": a.offset_s, "error_s": a.error_s}
                                                       for r, a in enumerate(alignment)]}}


def wire_per_step(events: list[dict]) -> dict[str, list[float]]:
    """Per collective (a message's name), each step's seconds on the wire in a trace's events (trace()), the mean
    over ranks: what `predict` prices per collective. The k-th message of a name in a step is the same collective
    on every rank (each issues them in the same order). It is on the wire from the last rank's launch of it, since
    it cannot start before, or from the end of the rank's message of that name before it, if later (they queue),
    to its end on the rank. A message's own length also holds the wait for a late rank; this leaves it out."""
    queues: dict[tuple[int, str], dict[int, list[dict]]] = {}
    for event in sorted((e for e in events if e.get("cat") == "message"), key=lambda e: e["ts"]):
        queues.setdefault((event["args"]["step"], event["name"]), {}).setdefault(event["pid"], []).append(event)
    seconds: dict[str, list[float]] = {}
    for (_, name), ranks in sorted(queues.items()):
        launched = [max(column) for column in zip(*([e["ts"] for e in queue] for queue in ranks.values()))]
        per_rank = []
        for queue in ranks.values():
            before = total = 0.0
            for event, launch in zip(queue, launched):
                end = event["ts"] + event["dur"]
                total += max(0.0, end - max(launch, before))
                before = end
            per_rank.append(total / 1e6)
        seconds.setdefault(name, []).append(statistics.fmean(per_rank))
    return seconds


def parse_window(text: str | None) -> tuple[int, int] | None:
    """--timeline-steps `A:B` (steps A to B, both included), `A:` (from A on) or `N` (that step); None: every
    step. ValueError for anything else."""
    if text is None:
        return None
    first, colon, last = text.partition(":")
    try:
        start = int(first)
        stop = (int(last) if last else ALL_STEPS) if colon else start
    except ValueError:
        raise ValueError(f"--timeline-steps {text!r} is not FIRST:LAST (e.g. 10:20), FIRST: or one step") from None
    if start < 1 or stop < start:
        raise ValueError(f"--timeline-steps {text!r} must name steps from 1 on, the first not after the last")
    return start, stop
