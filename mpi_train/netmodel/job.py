"""What a training job predicts for its own sync, from links it measures at start (or a bench's calibration)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import stragglers
from ..sync import label
from ..sync.traits import RING_ALLREDUCE
from .calibration import calibrate, load_backward, load_calibration
from .families import FAMILIES, family_of, traffic_size
from .links import Network, capped
from .prediction import (
    ASSUMED_BACKWARD,
    Backward,
    Layout,
    Prediction,
    gathered_share,
    later_share,
    predict,
    tensor_sizes,
    tensor_units,
    wire_bytes,
    wire_ratio,
)

QUICK_CALIBRATION_BYTES = 1 << 20  # a job's own ping-pong stops at 1 MB: well under a second even at 100 Mbit/s
QUICK_CALIBRATION_ITERS = 2


@dataclass(frozen=True)
class JobModel:
    """What a training job predicts for its own sync each step, and what a straggler host costs it."""

    method: object  # the job's configured SyncMethod
    prediction: Prediction
    network: Network
    layout: Layout
    tensor_bytes: list = field(default_factory=list)
    ratio: float | None = None  # the compressor's bytes on the wire per gradient byte
    later: float = 0.0  # the share of them summed after the first round (prediction.later_share)
    backward: Backward = ASSUMED_BACKWARD  # when each gradient is ready: measured by a bench (--calibration)
    host_links: dict = field(default_factory=dict)  # host -> bytes/s its link reached (empty with --calibration)
    straggler: stragglers.Straggler | None = None
    units: tuple | None = None  # each tensor's layer block (tensor_units): fsdp's messages

    def sync_time(self, compute_s: float, network: Network | None = None) -> float:
        """Predicted sync seconds per step; for an overlapped method its exposed time behind this measured compute,
        less what forward waits for (zero's and fsdp's gathers), which the job counts in its compute as it does."""
        if not self.prediction.overlapped and network is None:
            return self.prediction.comm_s
        again = predict(self.method, self.tensor_bytes, self.layout, network or self.network,
                        label=self.prediction.method, ratio=self.ratio, backward_s=self.backward.share * compute_s,
                        backward=self.backward, compute_s=compute_s, units=self.units, later=self.later)
        return again.sync_s - again.in_forward_s

    @property
    def fit_error(self) -> float:
        """How far the links its prediction crosses missed their own calibration points: the worst fit of them."""
        crossed = (self.network.intra, self.network.slowest) if self.layout.hosts > 1 else (self.network.intra,)
        return max(link.fit_error for link in crossed)

    def straggler_cost(self, compute_s: float) -> float | None:
        """Seconds per step the straggler adds: the predicted sync with the measured links minus with the others'."""
        if self.straggler is None:
            return None
        return self.sync_time(compute_s) - self.sync_time(compute_s, self.network.without_slow())


def compiled(backward: Backward, tensors: int) -> Backward:
    """When a compiled backward hands each of its gradients over: all at its end, together (a graph's backward is one
    autograd node), so a method whose hooks no graph break serves (traits' lost_when_compiled) sends them all there."""
    return Backward(share=backward.share, ready=(1.0,) * tensors)


def job_model(config, cluster, model, method, device) -> JobModel | None:
    """The prediction a training job logs beside its measured sync time; None on one host or for an unmodelled method.

    Links come from --calibration (a bench JSON) when given, else from a short ping-pong now, which also finds a
    straggler host (stragglers.py). A --link rate caps the inter-host bandwidth: a shaper lets a burst through at
    full speed (tc tbf: 10 ms of traffic, 1.25 MB at 1 Gbit/s), so messages of at most 1 MB can see a shaped link as
    faster than it is. Collective."""
    hosts = list(cluster.hosts)
    if len(hosts) == 1:
        return None
    measured = {}
    sizes = tensor_sizes(model)
    backward = ASSUMED_BACKWARD
    if config.calibration:
        network = load_calibration(config.calibration)  # every rank reads it, so a bad file stops all of them together
        backward = load_backward(config.calibration, len(sizes))
    else:
        calibration = calibrate(hosts, QUICK_CALIBRATION_BYTES, QUICK_CALIBRATION_ITERS, device, config.link)
        measured = cluster.bcast(calibration) or {}
        network = Network.from_dict(measured["network"]) if measured else None
    network = capped(network, config.link)
    straggler = stragglers.Straggler.from_dict(measured["straggler"]) if measured.get("straggler") else None
    layout = Layout.of_hosts(hosts)
    if config.compile and method.traits.lost_when_compiled:
        backward = compiled(backward, len(sizes))
    ratio = wire_ratio(method, list(model.parameters()))  # what its compressor sends
    later = later_share(method, list(model.parameters()))
    units = tuple(tensor_units(model))
    prediction = predict(method, sizes, layout, network, label=label(config.sync, config.compression), ratio=ratio,
                         units=units, later=later)
    if prediction is None:
        return None
    return JobModel(method=method, prediction=prediction, network=network, layout=layout, tensor_bytes=sizes,
                    ratio=ratio, later=later, backward=backward, host_links=measured.get("host_links", {}),
                    straggler=straggler, units=units)


def layout_params(hosts: Sequence[str]) -> dict:
    """Params every job records: how many hosts it spans and the most ranks on one of them."""
    return {"num_hosts": len(set(hosts)), "ranks_per_host": Layout.of_hosts(list(hosts)).ranks_per_host}


def bytes_sent_per_sync(method, model, hosts: Sequence[str], rank: int) -> dict[str, float]:
    """Bytes this rank puts on the wire each time its method syncs, by what the step synced (Synced.scope),
    as the method's collective family counts them (families.py): what `network/sent_mb` adds up. "all": the
    method's own sync of every rank, compressed as it sends; "gradients": a model-averaging method's warm-up
    (plain gradients, ring); "host": its average among the ranks of one host (plain, ring)."""
    params = [p for p in model.parameters() if p.requires_grad]
    world, ring = len(hosts), FAMILIES[RING_ALLREDUCE]
    full = float(sum(p.numel() * p.element_size() for p in params))
    family = family_of(method)
    local = list(hosts).count(hosts[rank])
    sent = traffic_size(family, wire_bytes(method, params), full * gathered_share(method)) if family else 0.0
    return {"all": family.traffic(sent, world, rank, list(hosts))[0] if family else 0.0,
            "gradients": ring.traffic(full, world, rank)[0],
            "host": ring.traffic(full, local, 0)[0]}
