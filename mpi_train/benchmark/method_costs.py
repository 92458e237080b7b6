"""What each method costs, one row per method: its medians of the slowest rank, its bytes and floor from its
collective family, and the alpha-beta model's prediction held against what was measured."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .. import netmodel
from ..netmodel.families import bus_bandwidth, family_of
from ..sync.bucketed import DEFAULT_BUCKET_MB
from .contenders import NO_SYNC, configured
from .measure import after_last_backward, codec_after_backward, slowest, spread


@dataclass(frozen=True)
class ModelInputs:
    """What the alpha-beta model needs to predict a method's sync in this benchmark."""

    network: netmodel.Network
    layout: netmodel.Layout
    tensor_bytes: tuple
    bucket_mb: float
    backward: netmodel.Backward = netmodel.ASSUMED_BACKWARD  # when its gradients are ready, measured on no-sync
    units: tuple | None = None  # each tensor's layer block (netmodel.tensor_units): fsdp's messages


def summarise(per_rank: list[dict], gradient_bytes: int, world: int, bandwidth: float,
              sent: dict[str, float] | None = None, hosts: tuple[str, ...] | None = None,
              model_of: ModelInputs | None = None, later: dict[str, float] | None = None,
              precision: str = "32-true") -> list[dict]:
    """One row per method: medians over steps of the slowest rank, bytes and floor from its collective family, and
    the alpha-beta model's prediction when `model_of` gives the links, layout and tensor sizes.

    `sent` is S per method label as it sends it (default: the gradients' bytes in its wire dtype); `hosts` each
    rank's host, for the families that depend on placement; `later` the share of S each method sums after its
    first round (netmodel.later_share: PowerSGD's Qs); `precision` the one the bench ran at (resolved: fsdp gathers
    its parameters in it). A compressed method's codec is the median over steps of the slowest rank's."""
    names = list(per_rank[0])
    bucket_mb = model_of.bucket_mb if model_of else DEFAULT_BUCKET_MB

    # The step from barrier to barrier, not the slowest compute plus the slowest sync: where no barrier parts them
    # (overlapped methods), the rank that finishes backward first waits longest in sync, and that sum counts both.
    steps = {name: slowest(per_rank, name, "step") for name in names}
    rows = []
    for name in names:
        method = configured(name, bucket_mb, precision=precision)
        compute = statistics.median(slowest(per_rank, name, "compute"))
        sync = statistics.median(slowest(per_rank, name, "sync"))
        differences = [s - b for s, b in zip(steps[name], steps[NO_SYNC])]
        exposed = statistics.median(differences)
        codec = statistics.median(slowest(per_rank, name, "codec")) if "codec" in per_rank[0][name] else None
        codec_backward = (statistics.median(slowest(per_rank, name, "codec_backward"))
                          if "codec_backward" in per_rank[0][name] else None)
        # an overlapped method's own wait (ddp's is inside backward, so not in its sync: none)
        tails = (after_last_backward(per_rank, name)
                 if name != NO_SYNC and method.traits.overlapped() and not method.traits.inside_ddp() else None)
        after_backward = statistics.median(tails) if tails else None
        row = {"method": name, "compute_s": compute, "sync_s": sync, "step_s": statistics.median(steps[name]),
               "exposed_s": exposed, "noise_s": spread(differences), "after_backward_s": after_backward,
               "after_backward_noise_s": spread(tails) if tails else None,
               "collective": None, "wire_bytes": None, "sent_bytes": None, "received_bytes": None,
               "busbw_bytes_per_s": None, "floor_s": None, "efficiency": None, "codec_s": codec,
               "codec_backward_s": codec_backward}
        family = None if name == NO_SYNC else family_of(method)
        ratio = sent[name] / gradient_bytes if sent and name in sent else None  # what its compressor sends
        if family is not None:
            overlapped = method.traits.overlapped()
            comm = None if overlapped else sync
            size = gradient_bytes * ratio if ratio is not None else gradient_bytes * (
                method.traits.wire_dtype.itemsize / 4 if method.traits.wire_dtype is not None else 1.0)
            moved = netmodel.traffic_size(family, size, gradient_bytes * netmodel.gathered_share(method))
            traffic = [family.traffic(moved, world, rank, hosts) for rank in range(world)]
            floor = family.floor(moved, world, bandwidth, hosts) if world > 1 else 0.0
            row.update({
                "collective": family.name, "comm_s": comm, "overlapped": overlapped, "wire_bytes": size,
                "sent_bytes": [sent_ for sent_, _ in traffic], "received_bytes": [received for _, received in traffic],
                "busbw_bytes_per_s": bus_bandwidth(size, world, comm) if world > 1 and comm else None,
                # an overlapped method's communication hides in backward: no time to hold the floor against (n/a)
                "floor_s": floor, "efficiency": min(1.0, floor / comm) if world > 1 and comm else None,
            })
        if model_of is not None and name != NO_SYNC:
            backward = model_of.backward.share * statistics.median(slowest(per_rank, NO_SYNC, "compute"))
            prediction = netmodel.predict(method, model_of.tensor_bytes, model_of.layout, model_of.network, label=name,
                                          ratio=ratio, backward_s=backward, backward=model_of.backward,
                                          units=model_of.units, later=(later or {}).get(name, 0.0),
                                          step_ends_at_barrier=True)  # (zero's all-gathers are waited for there)
            if prediction is not None:
                measured = (sync if not prediction.overlapped else
                            after_backward if after_backward is not None else exposed)
                # the wire, plus the compressor's CPU after backward, timed here (what it does in backward lengthens
                # backward, the step's compute): where each bucket's work runs between its sums, placed there
                predicted = prediction.sync_s + (row["codec_s"] or 0.0)
                intervals = (codec_after_backward(per_rank, name)
                             if after_backward is not None and "codec_intervals" in per_rank[0][name] else None)
                placed = codec_placed(prediction, backward, intervals)
                if placed is not None:
                    predicted = placed
                row.update({"predicted_s": predicted, "predicted_comm_s": prediction.comm_s,
                            "codec_placed": placed is not None,  # (its intervals, each a median over steps)
                            "codec_intervals_s": intervals if placed is not None else None,
                            "measured_s": measured, "messages": prediction.messages,
                            "prediction_error": (predicted - measured) / measured if measured > 0 else None})
        rows.append(row)
    return rows


def codec_placed(prediction: netmodel.Prediction, backward_s: float, codec: list[float] | None) -> float | None:
    """An overlapped method's predicted sync with its codec intervals after backward placed between its sums, as
    its sync() runs them (netmodel.with_codec), instead of added after the wire; None where they do not fit."""
    exposed = netmodel.with_codec(prediction.plan, backward_s, codec) if codec else None
    if exposed is None:
        return None
    return prediction.sync_s - max(0.0, prediction.plan[-1].end_s - backward_s) + exposed
